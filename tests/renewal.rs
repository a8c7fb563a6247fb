//! The renewal driver and the loss semantics, in one process with its own
//! client: max_hold, drop, panic, current(), on_lost, batching.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{current, Client, Config, Lock, LockError, LostCause, OnLost};

const TTL: Duration = Duration::from_millis(300);

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// A lock with the test ttl, renewed, on `client`.
fn renewed(client: &Client, name: impl Into<String>) -> Lock {
    Lock::new(name).ttl(TTL).renew().client(client.clone())
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis(server, &["EXISTS", key]) == ":1\r\n"
}

async fn wait_for_renewals(client: &Client, at_least: u64) {
    wait_until_async("renewals were sent", LINE_TIMEOUT, || {
        client.renewal_stats().renewals_sent >= at_least
    })
    .await;
}

/// Nothing is renewed any more, and stays so for two renewal intervals.
async fn assert_renewals_stopped(client: &Client) {
    assert_eq!(client.renewal_stats().active, 0);
    let sent = client.renewal_stats().renewals_sent;
    tokio::time::sleep(TTL * 2 / 3 * 2).await; // an observation window, not a sync
    assert_eq!(
        client.renewal_stats().renewals_sent,
        sent,
        "a renewal went on"
    );
}

#[tokio::test]
async fn renewal_keeps_the_key_alive_past_its_ttl() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = renewed(&client, "kept").acquire().await.unwrap();
    wait_for_renewals(&client, 4).await; // more than a ttl of renewals
    assert!(exists(&server, "lock:{kept}"));
    assert!(guard.is_held() && guard.remaining() > Duration::ZERO);
    guard.release().await.unwrap();
    assert!(!exists(&server, "lock:{kept}"));
    assert_renewals_stopped(&client).await;
}

#[tokio::test]
async fn renewal_survives_a_script_cache_flush() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = renewed(&client, "flushed").acquire().await.unwrap();
    wait_for_renewals(&client, 1).await;
    assert_eq!(redis(&server, &["SCRIPT", "FLUSH"]), "+OK\r\n");
    let sent = client.renewal_stats().renewals_sent;
    wait_for_renewals(&client, sent + 3).await;
    tokio::time::sleep(TTL * 2).await; // an observation window of two ttls
                                       // Had the script not been loaded again, every renewal since the flush
                                       // would have failed and the lock would have expired by now.
    let stats = client.renewal_stats();
    assert_eq!(stats.lost, 0, "{stats:?}");
    assert!(guard.is_held(), "{stats:?}");
    assert!(exists(&server, "lock:{flushed}"));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn max_hold_stops_renewing_and_tells_the_holder() {
    let server = RedisServer::start();
    let client = client(&server);
    let started = Instant::now();
    let result = Lock::new("capped")
        .ttl(TTL)
        .renew()
        .max_hold(TTL * 2)
        .client(client.clone())
        .run(std::future::pending::<()>())
        .await;
    match result {
        Err(LockError::Lost {
            cause: LostCause::MaxHold,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= TTL * 2, "stopped before max_hold");
    assert!(client.renewal_stats().renewals_sent >= 1);
    assert_renewals_stopped(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_body_stops_renewing_and_releases() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = renewed(&client, "aborted");
    let task = tokio::spawn(async move { lock.run(std::future::pending::<()>()).await });
    wait_for_renewals(&client, 2).await;
    assert!(exists(&server, "lock:{aborted}"));
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    wait_until_async(
        "the aborted holder's lock is released",
        LINE_TIMEOUT,
        || !exists(&server, "lock:{aborted}"),
    )
    .await;
    assert_renewals_stopped(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_stops_renewing_and_releases() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = renewed(&client, "panicked");
    let watcher = client.clone();
    let task = tokio::spawn(async move {
        lock.run(async {
            wait_for_renewals(&watcher, 2).await;
            panic!("the body fails");
        })
        .await
    });
    assert!(task.await.unwrap_err().is_panic());
    wait_until_async(
        "the panicked holder's lock is released",
        LINE_TIMEOUT,
        || !exists(&server, "lock:{panicked}"),
    )
    .await;
    assert_renewals_stopped(&client).await;
}

#[tokio::test]
async fn current_describes_the_held_lock_inside_the_body_only() {
    let server = RedisServer::start();
    let client = client(&server);
    assert!(current().is_none());
    let seen = renewed(&client, "described")
        .run(async {
            let lock = current().expect("inside the body");
            let stored = value(&redis(&server, &["GET", lock.redis_key()]));
            (
                lock.name().to_owned(),
                stored == Some(lock.token().to_owned()),
                lock.is_held(),
                lock.is_renewed(),
                lock.remaining(),
            )
        })
        .await
        .unwrap();
    assert_eq!(seen.0, "described");
    assert!(seen.1, "the token is the key's value");
    assert!(seen.2 && seen.3);
    assert!(seen.4 > Duration::ZERO && seen.4 <= TTL);
    assert!(current().is_none());
}

#[tokio::test]
async fn a_lost_lock_stops_the_body_by_default() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = renewed(&client, "stolen");
    let result = lock
        .run(async {
            // Someone deletes the key (an operator, a Redis without
            // persistence restarting): the next renewal finds it gone.
            redis(&server, &["DEL", "lock:{stolen}"]);
            std::future::pending::<()>().await
        })
        .await;
    match result {
        Err(LockError::Lost {
            cause: LostCause::Expired,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(client.renewal_stats().lost, 1);
}

#[tokio::test]
async fn on_lost_continue_lets_the_body_finish() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("continued")
        .ttl(TTL)
        .renew()
        .on_lost(OnLost::Continue)
        .client(client.clone());
    let watcher = client.clone();
    let result = lock
        .run(async {
            redis(&server, &["DEL", "lock:{continued}"]);
            wait_until_async("the loss is found", LINE_TIMEOUT, || {
                watcher.renewal_stats().lost == 1
            })
            .await;
            let lock = current().unwrap();
            (lock.is_held(), lock.lost_cause())
        })
        .await
        .unwrap();
    assert_eq!(result, (false, Some(LostCause::Expired)));
}

#[tokio::test]
async fn the_guard_says_when_the_lock_is_lost() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = renewed(&client, "watched").acquire().await.unwrap();
    redis(&server, &["DEL", "lock:{watched}"]);
    assert_eq!(guard.lost().await, LostCause::Expired);
    assert!(!guard.is_held());
    let release = guard.release().await.unwrap_err();
    assert!(release.is_lost());
}

#[tokio::test]
async fn renewals_due_together_share_round_trips() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut guards = Vec::new();
    for n in 0..200 {
        let lock = renewed(&client, format!("batch:{n}"));
        guards.push(lock.acquire().await.unwrap());
    }
    // Once the locks' renewals have converged (a few intervals), measure.
    wait_for_renewals(&client, 200 * 3).await;
    let before = client.renewal_stats();
    wait_for_renewals(&client, before.renewals_sent + 200 * 3).await;
    let after = client.renewal_stats();
    assert_eq!(after.active, 200);
    assert_eq!(after.lost, 0, "{after:?}");
    let (round_trips, renewals) = (
        after.round_trips - before.round_trips,
        after.renewals_sent - before.renewals_sent,
    );
    assert!(
        round_trips * 10 <= renewals,
        "renewals were not batched: {renewals} renewals in {round_trips} round trips"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_renewals_stopped(&client).await;
}

#[tokio::test]
async fn max_hold_and_on_lost_need_renew() {
    let server = RedisServer::start();
    let client = client(&server);
    let capped = Lock::new("x")
        .max_hold(TTL)
        .client(client.clone())
        .acquire()
        .await;
    assert!(matches!(capped, Err(LockError::Config { ref message }) if message.contains("renew")));
    let continued = Lock::new("x")
        .on_lost(OnLost::Continue)
        .client(client)
        .acquire()
        .await;
    assert!(matches!(continued, Err(LockError::Config { .. })));
}
