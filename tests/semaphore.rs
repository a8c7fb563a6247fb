//! The semaphore on a real Redis: capacity, many permits at once, stray and
//! expired releases, capacity mismatch, waking, renewal.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{Client, Config, LockError, LostCause, Semaphore};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

const KEY: &str = "lock:{exports}:sem";

fn holders(server: &RedisServer) -> usize {
    let reply = redis(server, &["ZRANGE", KEY, "0", "-1"]);
    reply
        .split("\r\n")
        .filter(|line| !line.starts_with('*') && !line.starts_with('$') && !line.is_empty())
        .filter(|member| !member.starts_with("#capacity:"))
        .count()
}

#[tokio::test]
async fn at_most_n_permits_and_the_capacity_is_stored() {
    let server = RedisServer::start();
    let semaphore = Semaphore::new("exports", 2)
        .ttl(Duration::from_secs(10))
        .client(client(&server));
    let first = semaphore.try_acquire().await.unwrap();
    let second = semaphore.try_acquire().await.unwrap();
    assert_eq!(first.redis_key(), KEY);
    let busy = semaphore.try_acquire().await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy:?}");
    assert_eq!(holders(&server), 2);
    assert_eq!(
        value(&redis(&server, &["ZSCORE", KEY, "#capacity:2"])).as_deref(),
        Some("inf")
    );
    first.release().await.unwrap();
    let third = semaphore.try_acquire().await.unwrap();
    second.release().await.unwrap();
    third.release().await.unwrap();
    // Nobody holds: no key left behind.
    assert_eq!(redis(&server, &["EXISTS", KEY]), ":0\r\n");
}

#[tokio::test]
async fn several_permits_are_taken_together_or_not_at_all() {
    let server = RedisServer::start();
    let semaphore = Semaphore::new("exports", 3).client(client(&server));
    let one = semaphore.try_acquire().await.unwrap();
    let two = semaphore.try_acquire_many(2).await.unwrap();
    assert!(semaphore.try_acquire().await.is_err());
    one.release().await.unwrap();
    // One free, two asked: none taken.
    assert!(semaphore.try_acquire_many(2).await.is_err());
    assert_eq!(holders(&server), 1);
    two.release().await.unwrap();
    let error = semaphore.try_acquire_many(4).await.unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    let error = Semaphore::new("exports", 0)
        .client(client(&server))
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
}

#[tokio::test]
async fn opening_a_held_semaphore_with_another_capacity_is_an_error() {
    let server = RedisServer::start();
    let client = client(&server);
    let two = Semaphore::new("exports", 2).client(client.clone());
    let held = two.try_acquire().await.unwrap();
    let error = Semaphore::new("exports", 5)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(error.to_string().contains("held with 2 permits"), "{error}");
    assert_eq!(holders(&server), 1);
    held.release().await.unwrap();
    // Once nobody holds, it may be reopened with another capacity.
    let five = Semaphore::new("exports", 5).client(client);
    let guards = [
        five.try_acquire_many(3).await.unwrap(),
        five.try_acquire_many(2).await.unwrap(),
    ];
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn an_expired_permits_release_is_a_loss_and_creates_nothing() {
    let server = RedisServer::start();
    let semaphore = Semaphore::new("exports", 2)
        .ttl(Duration::from_millis(100))
        .client(client(&server));
    let guard = semaphore.try_acquire().await.unwrap();
    wait_until_async("the permit expired", Duration::from_secs(5), || {
        redis(&server, &["EXISTS", KEY]) == ":0\r\n"
    })
    .await;
    let error = guard.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Expired,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(redis(&server, &["EXISTS", KEY]), ":0\r\n");
}

#[tokio::test]
async fn a_release_wakes_a_waiter_and_a_dead_holders_permit_comes_back() {
    let server = RedisServer::start();
    let client = client(&server);
    let semaphore = Semaphore::new("exports", 1)
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .client(client.clone());
    let holder = semaphore.try_acquire().await.unwrap();
    let waiter = {
        let semaphore = semaphore.clone();
        tokio::spawn(async move { semaphore.acquire().await })
    };
    wait_until_async("the waiter queued", Duration::from_secs(5), || {
        redis(&server, &["LLEN", "lock:{exports}:sem:queue"]) == ":1\r\n"
    })
    .await;
    // The holder's ttl is 30 s: the release's message wakes the waiter
    // (its refresh, every 500 ms, would too, later: the message is counted).
    let published = command_calls(&server, "publish");
    holder.release().await.unwrap();
    assert!(
        command_calls(&server, "publish") > published,
        "the release woke nobody"
    );
    let woken = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    woken.release().await.unwrap();
    // A holder that dies (never releases) gives its permit back at the end
    // of its ttl, with no cleanup job (without one it would never come
    // back: the wait would end).
    let short = Semaphore::new("exports", 1)
        .ttl(Duration::from_millis(300))
        .wait(Duration::from_secs(10))
        .client(client);
    tokio::time::timeout(LINE_TIMEOUT, async {
        let dying = short.try_acquire().await.unwrap();
        std::mem::forget(dying);
        short.acquire().await.unwrap().release().await.unwrap();
    })
    .await
    .expect("the dead holder's permit came back within its ttl");
}

/// A contender that releases a permit and asks again at once (a worker in a
/// loop) lets the waiter its release woke go first, as after an exclusive
/// lock's hand-over: its first attempt joins the queue behind that waiter
/// instead of taking back the permit it just freed (before the woken waiter
/// could arrive, every time: the W6 wait p99 of 23-31 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_releaser_asking_again_lets_the_woken_waiter_go_first() {
    let server = RedisServer::start();
    let semaphore = Semaphore::new("exports", 1)
        .ttl(Duration::from_secs(30))
        .wait(LINE_TIMEOUT);
    let releaser = semaphore.clone().client(client(&server));
    let held = releaser.try_acquire().await.unwrap();
    let waiter = {
        let semaphore = semaphore.clone().client(client(&server));
        tokio::spawn(async move { semaphore.acquire().await })
    };
    let queue = "lock:{exports}:sem:queue";
    wait_until_async("the waiter queued", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", queue]) == ":1\r\n"
    })
    .await;
    let waiters_entry = value(&redis(&server, &["LINDEX", queue, "0"])).unwrap();
    held.release().await.unwrap();
    let again = tokio::spawn(async move { releaser.acquire().await });
    // The releaser's first attempt queues (it is refused while the woken
    // waiter is ahead of it, or finds the permit taken by it). Had it taken
    // the permit, it would never queue.
    wait_until_async("the releaser queued", Duration::from_secs(10), || {
        redis(&server, &["LRANGE", queue, "0", "-1"])
            .split("\r\n")
            .any(|line| line.contains("|lock-waiters:") && line != waiters_entry)
    })
    .await;
    let first = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("the woken waiter got the permit")
        .unwrap()
        .unwrap();
    assert!(!again.is_finished(), "the releaser took a second permit");
    first.release().await.unwrap();
    let second = tokio::time::timeout(LINE_TIMEOUT, again)
        .await
        .expect("then the releaser")
        .unwrap()
        .unwrap();
    second.release().await.unwrap();
}

#[tokio::test]
async fn a_renewed_permit_outlives_its_ttl() {
    let server = RedisServer::start();
    let client = client(&server);
    let semaphore = Semaphore::new("exports", 1)
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone());
    let output = semaphore
        .run(async {
            // Past its ttl: renewed 4 times, every 200 ms.
            wait_until_async("renewed past the ttl", LINE_TIMEOUT, || {
                client.renewal_stats().renewals_sent >= 4
            })
            .await;
            lock_runtime::current().unwrap().is_held()
        })
        .await
        .unwrap();
    assert!(output);
    assert_eq!(client.renewal_stats().lost, 0);
    assert_eq!(redis(&server, &["EXISTS", KEY]), ":0\r\n");
}
