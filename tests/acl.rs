//! ACL: a Redis user allowed only what this library needs (the rule in the
//! the guide, "Configuration") runs every primitive; a user missing one
//! permission gets an error naming it, at once, not a hang.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, RwLock, Semaphore};

/// The guide's minimal rule (Configuration) for the default `lock:` prefix, for a user
/// whose password is `secret`.
fn rule() -> Vec<&'static str> {
    [&["on", ">secret"][..], test_support::LOCK_ACL].concat()
}

fn user(server: &RedisServer, name: &str, rule: &[&str]) -> Client {
    Client::new(user_config(server, name, rule)).unwrap()
}

/// Sets up the user `name` with `rule`; the configuration of a client
/// that logs in as that user.
fn user_config(server: &RedisServer, name: &str, rule: &[&str]) -> Config {
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend_from_slice(rule);
    let reply = redis(server, &args);
    assert!(reply.starts_with("+OK"), "{reply}");
    Config::new(format!(
        "redis://{name}:secret@127.0.0.1:{}/",
        server.port()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_rule_runs_every_primitive() {
    let server = RedisServer::start();
    let (one, other) = (
        user(&server, "locker", &rule()),
        user(&server, "locker", &rule()),
    );
    // Try, busy, fencing, renew, release.
    let held = Lock::new("acl")
        .fencing()
        .ttl(Duration::from_millis(900))
        .renew()
        .client(one.clone())
        .try_acquire()
        .await
        .unwrap();
    let busy = Lock::new("acl").client(other.clone()).try_acquire().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    // A waiter of another client, woken by the release.
    let waiter = spawn_waiter(&other, "acl", Duration::from_secs(10));
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{acl}:queue"]) == ":1\r\n"
    })
    .await;
    // Renewed past its ttl: 4 renewals, every 300 ms.
    wait_until_async("renewed past its ttl", LINE_TIMEOUT, || {
        one.renewal_stats().renewals_sent >= 4
    })
    .await;
    assert!(held.is_held());
    held.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();
    // Read/write lock and semaphore.
    let rw = RwLock::new("acl").client(one.clone());
    let read = rw.read().try_acquire().await.unwrap();
    read.release().await.unwrap();
    rw.write()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let semaphore = Semaphore::new("acl", 2).client(one.clone());
    semaphore
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(one.renewal_stats().lost, 0);
}

/// The holder record (`lock:client:{<id>}`, under `~lock:*`) is written
/// with the minimal rule: HSET, HDEL, EXISTS, DEL and PEXPIRE in its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_rule_writes_the_holder_record() {
    let server = RedisServer::start();
    let client = user(&server, "locker", &rule());
    let guard = Lock::new("recorded")
        .caller("acl::recorded")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let record = format!("lock:client:{{{}}}", client.id());
    let field = format!("h:{}", &guard.token()[..16]);
    wait_until_async("the hold is recorded", LINE_TIMEOUT, || {
        value(&redis(&server, &["HGET", &record, &field]))
            .is_some_and(|hold| hold.ends_with("|lock|acl::recorded|recorded"))
    })
    .await;
    guard.release().await.unwrap();
    wait_until_async("the record is deleted (HDEL, DEL)", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", &record]) == ":0\r\n"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_named_at_once() {
    let server = RedisServer::start();
    let mut rule: Vec<&str> = rule()
        .into_iter()
        .filter(|rule| *rule != "+evalsha")
        .collect();
    rule.push("-evalsha");
    // A call may take up to 10 s (connect + response timeouts): an error
    // retried until then is far past the bound below.
    let client = Client::new(
        user_config(&server, "lacking", &rule)
            .connect_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    // The first call of a script is EVAL (allowed); its second is EVALSHA.
    let started = Instant::now();
    let mut outcome = Ok(());
    for _ in 0..3 {
        match Lock::new("lacking")
            .fencing()
            .client(client.clone())
            .try_acquire()
            .await
        {
            Ok(guard) => guard.release().await.unwrap_or(()),
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
    }
    let error = outcome.expect_err("EVALSHA is refused");
    let message = error.to_string();
    assert!(
        message.contains("evalsha") && message.contains("lacks a permission"),
        "{message}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}
