//! Hand-off by notification, fencing tokens against a stale writer,
//! `hold_at_least` and `fair`, with real processes.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};

/// Calls of `command` Redis has run so far (those made by scripts included).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = redis(server, &["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Acquire-script calls Redis has run so far.
fn acquire_calls(server: &RedisServer) -> u64 {
    calls(server, "evalsha")
}

fn queued(server: &RedisServer, key: &str) -> bool {
    redis(server, &["LLEN", &format!("lock:{{{key}}}:queue")]) == ":1\r\n"
}

/// How often a waiter refreshes its queue place while nothing wakes it.
const QUEUE_REFRESH_MS: u128 = 500;

/// The most acquire attempts a waiter that sleeps until it is woken makes
/// in `elapsed`: `base`, plus one refresh of its queue place per refresh
/// interval begun. A waiter polling makes several per interval.
fn sleeping_attempts(base: u64, elapsed: Duration) -> u64 {
    base + (elapsed.as_millis() / QUEUE_REFRESH_MS) as u64 + 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_without_polling() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let mut holder = worker(&server, &["hold", "handoff", "30000"]);
    holder.line(LINE_TIMEOUT);
    let waiter = tokio::spawn({
        let lock = Lock::new("handoff")
            .wait(Duration::from_secs(20))
            .client(client);
        async move { lock.acquire().await }
    });
    // The waiter is queued: from here it listens for the release.
    wait_until_async("the waiter queued", LINE_TIMEOUT, || {
        queued(&server, "handoff")
    })
    .await;
    let window = Instant::now();
    let calls_before = acquire_calls(&server);
    // A polling waiter would try many times in this window; ours sleeps
    // (the holder's ttl is 30 s) until the release message, but for its
    // attempt right after subscribing and a refresh of its queue place
    // every 500 ms (counted from the time the window really took: on a
    // loaded machine it can last much longer than asked).
    tokio::time::sleep(Duration::from_millis(1000)).await; // an observation window
    let calls_waiting = acquire_calls(&server) - calls_before;
    let allowed = sleeping_attempts(1, window.elapsed());
    assert!(
        calls_waiting <= allowed,
        "{calls_waiting} attempts while the lock was held {:?} (a sleeping waiter makes \
         at most {allowed})",
        window.elapsed()
    );
    let handing_over = Instant::now();
    let calls_at_release = acquire_calls(&server);
    holder.send("release");
    assert_eq!(holder.line(LINE_TIMEOUT), "released");
    let guard = waiter.await.unwrap().expect("the waiter gets the lock");
    // The release and the one attempt its message triggered (refreshes may
    // fall in between on a loaded machine).
    let calls = acquire_calls(&server) - calls_at_release;
    let allowed = sleeping_attempts(2, handing_over.elapsed());
    assert!(
        calls <= allowed,
        "{calls} script calls from the release to the hand-off in {:?} (at most {allowed})",
        handing_over.elapsed()
    );
    guard.release().await.unwrap();
    assert_eq!(
        redis(&server, &["EXISTS", "lock:{handoff}:queue"]),
        ":0\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_takes_over_a_killed_holder_at_its_expiry() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    // A long ttl, shortened below once the waiter is queued: on a loaded
    // machine a 1 s key could expire before the waiter even queues.
    let mut holder = worker(&server, &["hold", "crash", "30000"]);
    holder.line(LINE_TIMEOUT);
    let waiter = tokio::spawn({
        let lock = Lock::new("crash")
            .wait(Duration::from_secs(20))
            .client(client);
        async move { lock.acquire().await }
    });
    wait_until_async("the waiter queued", LINE_TIMEOUT, || {
        queued(&server, "crash")
    })
    .await;
    let started = Instant::now();
    let calls_before = acquire_calls(&server);
    // No release, no message: only the expiry frees the key, which has a
    // second left.
    holder.kill_hard();
    assert_eq!(
        redis(&server, &["PEXPIRE", "lock:{crash}", "1000"]),
        ":1\r\n"
    );
    let guard = waiter.await.unwrap().expect("taken over after the expiry");
    // The waiter slept until the key's expiry, then took it: no polling.
    // At most the attempt right after subscribing, the refreshes of its
    // queue place (every 500 ms) and the attempt at the expiry; a waiter
    // polling with backoff makes dozens.
    let calls = acquire_calls(&server) - calls_before;
    let allowed = sleeping_attempts(2, started.elapsed());
    assert!(
        calls <= allowed,
        "{calls} attempts while waiting {:?} for the expiry (at most {allowed})",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "taken {:?} after the kill, before the key expired",
        started.elapsed()
    );
    guard.release().await.unwrap();
}

#[test]
fn a_stale_writer_is_rejected_by_its_fencing_token() {
    let server = RedisServer::start();
    let mut stale = worker(&server, &["fenced-writer", "invoice", "300"]);
    let stale_fence: u64 = stale.line(LINE_TIMEOUT)["held ".len()..].parse().unwrap();
    // The first holder is paused past its ttl (a GC pause, an overloaded
    // host); another instance takes the lock and writes.
    stale.pause();
    wait_until("the paused holder's lock expired", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{invoice}"]) == ":0\r\n"
    });
    let mut fresh = worker(&server, &["fenced-writer", "invoice", "30000"]);
    let fresh_fence: u64 = fresh.line(LINE_TIMEOUT)["held ".len()..].parse().unwrap();
    assert!(fresh_fence > stale_fence);
    fresh.send("write");
    assert_eq!(fresh.line(LINE_TIMEOUT), "accepted");
    // The first holder wakes up and writes under its old token: rejected.
    stale.resume();
    stale.send("write");
    assert_eq!(stale.line(LINE_TIMEOUT), "rejected");
    assert_eq!(
        value(&redis(&server, &["GET", "store:value"])).unwrap(),
        format!("written under {fresh_fence}")
    );
}

#[test]
fn hold_at_least_keeps_a_fast_job_from_running_twice() {
    let server = RedisServer::start();
    // `hold_at_least = "30s"`: a second instance started a second later
    // tries well within it, even on a loaded machine (with 3 s, starting
    // it could take the rest).
    let pttl = || -> i64 {
        value(&redis(&server, &["PTTL", "lock:{noon}"]))
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut first = worker(&server, &["quick-job", "noon", "30s"]);
    assert_eq!(first.line(LINE_TIMEOUT), "ran");
    let kept = pttl();
    assert!(
        kept > 0 && kept <= 30_000,
        "kept for the rest of 30 s after the body, PTTL {kept}"
    );
    // Another instance's scheduler fires a second later.
    wait_until("a second passed", LINE_TIMEOUT, || pttl() <= kept - 1000);
    let mut second = worker(&server, &["quick-job", "noon", "30s"]);
    assert_eq!(second.line(LINE_TIMEOUT), "busy");
    assert!(pttl() > 0, "the lock was still held");
}

#[test]
fn fair_waiters_get_the_lock_in_arrival_order() {
    const WAITERS: usize = 10;
    let server = RedisServer::start();
    let mut holder = worker(&server, &["hold", "queue", "30000"]);
    holder.line(LINE_TIMEOUT);
    let mut waiters = Vec::new();
    for id in 0..WAITERS {
        waiters.push(worker(&server, &["fair-wait", "queue", &id.to_string()]));
        // The next one arrives only once this one has its place in line.
        wait_until("the waiter joined the queue", LINE_TIMEOUT, || {
            redis(&server, &["LLEN", "lock:{queue}:queue"]) == format!(":{}\r\n", id + 1)
        });
    }
    let started = Instant::now();
    let published = calls(&server, "publish");
    holder.send("release");
    for waiter in &mut waiters {
        assert_eq!(waiter.line(LINE_TIMEOUT), "done");
    }
    // Each release woke the next in line with one message (each waiter
    // that took the lock with others still queued named the next in its
    // wake mark).
    assert_eq!(calls(&server, "publish") - published, WAITERS as u64);
    let order = redis(&server, &["LRANGE", "order", "0", "-1"]);
    let order: Vec<usize> = order
        .split("\r\n")
        .skip(1)
        .filter(|line| !line.starts_with('$') && !line.is_empty())
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "after {:?}",
        started.elapsed()
    );
    assert_eq!(redis(&server, &["EXISTS", "lock:{queue}:queue"]), ":0\r\n");
}

#[tokio::test]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let _holder = Lock::new("busy")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let gave_up = Lock::new("busy")
        .wait(Duration::from_millis(200))
        .client(client)
        .acquire()
        .await
        .unwrap_err();
    assert!(gave_up.is_busy(), "{gave_up:?}");
    wait_until_async("the waiter left the queue", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{busy}:queue"]) == ":0\r\n"
            && redis(&server, &["EXISTS", "lock:{busy}:waiters"]) == ":0\r\n"
    })
    .await;
}

#[test]
fn a_lock_taken_ahead_of_the_queue_still_wakes_it() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(async { Client::new(Config::new(server.url())).unwrap() });
    let lock = Lock::new("ahead")
        .ttl(Duration::from_secs(30))
        .client(client);
    let first = runtime.block_on(lock.acquire()).unwrap();
    let mut waiter = worker(&server, &["wait", "ahead", "w"]);
    wait_until("the waiter queued", LINE_TIMEOUT, || {
        queued(&server, "ahead")
    });
    let calls_queued = acquire_calls(&server);
    let held = || value(&redis(&server, &["GET", "lock:{ahead}"])).unwrap_or_default();
    // The holder's value names the waiter its release must wake: the
    // waiter's queue entry, `<its client's channel>|<its token>`.
    let queued = value(&redis(&server, &["LINDEX", "lock:{ahead}:queue", "0"])).unwrap();
    assert!(queued.starts_with("lock-waiters:"), "{queued}");
    assert_eq!(
        held(),
        format!("{}|{queued}", first.token()),
        "a waiter queueing marks the holder"
    );
    // The waiter has subscribed to its channel and made its attempt right
    // after (its next is a refresh 500 ms later): it sleeps.
    let channel = queued.split('|').next().unwrap().to_owned();
    wait_until(
        "the waiter subscribed and tried again",
        LINE_TIMEOUT,
        || {
            redis(&server, &["PUBSUB", "NUMSUB", &channel]).ends_with(":1\r\n")
                && acquire_calls(&server) > calls_queued
        },
    );
    // While the waiter sleeps, the first holder's key goes (as at its
    // expiry) and a newcomer takes the free lock with a plain SET: unmarked.
    // Paused for real (every thread stopped: SIGSTOP is asynchronous), so no
    // attempt of the waiter can take the freed key first; one it sent
    // before stopping reached Redis before the DEL below.
    waiter.pause_fully(LINE_TIMEOUT);
    redis(&server, &["DEL", "lock:{ahead}"]);
    let newcomer = runtime.block_on(lock.try_acquire()).unwrap();
    assert_eq!(held(), newcomer.token());
    waiter.resume();
    // The waiter's next attempt (its queue refresh) marks the newcomer...
    wait_until("the newcomer marked", LINE_TIMEOUT, || {
        held() == format!("{}|{queued}", newcomer.token())
    });
    // ... whose release then wakes it: one message, and the lock is its.
    let published = calls(&server, "publish");
    runtime.block_on(newcomer.release()).unwrap();
    assert_eq!(waiter.line(LINE_TIMEOUT), "done");
    assert_eq!(calls(&server, "publish") - published, 1);
    let lost = runtime.block_on(first.release()).unwrap_err();
    assert!(lost.is_lost(), "{lost:?}");
}

#[test]
fn the_wake_mark_follows_the_head_of_the_queue() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (holder_client, waiter_client) = runtime.block_on(async {
        let config = || Config::new(server.url());
        (
            Client::new(config()).unwrap(),
            Client::new(config()).unwrap(),
        )
    });
    let holder = runtime
        .block_on(
            Lock::new("line")
                .ttl(Duration::from_secs(30))
                .client(holder_client)
                .acquire(),
        )
        .unwrap();
    let held = || value(&redis(&server, &["GET", "lock:{line}"])).unwrap_or_default();
    let entry = |index: &str| value(&redis(&server, &["LINDEX", "lock:{line}:queue", index]));
    let queue_length =
        |n: usize| redis(&server, &["LLEN", "lock:{line}:queue"]) == format!(":{n}\r\n");
    // First in line: a waiter in this process, which gives up (cancelled)
    // once the others are queued behind it.
    let first = runtime.spawn(async move {
        Lock::new("line")
            .wait(Duration::from_secs(60))
            .client(waiter_client)
            .acquire()
            .await
    });
    wait_until("the first waiter queued", LINE_TIMEOUT, || queue_length(1));
    let first_entry = entry("0").unwrap();
    let mut second = worker(&server, &["wait", "line", "2"]);
    wait_until("the second waiter queued", LINE_TIMEOUT, || queue_length(2));
    let second_entry = entry("1").unwrap();
    let mut third = worker(&server, &["wait", "line", "3"]);
    wait_until("the third waiter queued", LINE_TIMEOUT, || queue_length(3));
    let third_entry = entry("2").unwrap();
    assert_eq!(held(), format!("{}|{first_entry}", holder.token()));

    // The first gives up: its leaving names the next in line.
    first.abort();
    let gave_up = runtime.block_on(first).unwrap_err();
    assert!(gave_up.is_cancelled(), "{gave_up:?}");
    wait_until("the mark names the second", LINE_TIMEOUT, || {
        held() == format!("{}|{second_entry}", holder.token())
    });

    // The second dies: once its place expires (2 s without a refresh), the
    // third's next refresh drops it and names itself.
    second.kill_hard();
    wait_until("the mark names the third", Duration::from_secs(10), || {
        held() == format!("{}|{third_entry}", holder.token())
    });

    // The release wakes the third with one message.
    let published = calls(&server, "publish");
    runtime.block_on(holder.release()).unwrap();
    assert_eq!(third.line(LINE_TIMEOUT), "done");
    assert_eq!(calls(&server, "publish") - published, 1);
}
