//! Network faults between the lock clients and a healthy Redis: connections
//! closed while idle (a proxy's idle timeout, `drop_all`, `CLIENT KILL`),
//! stalled connections, added latency and a Redis that refuses connections.
//!
//! The lock clients talk to Redis through `test_support::Proxy` (or the
//! `Freezer` below); every check of Redis state goes to the server's own
//! port, past the faults.

mod common;
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LostCause};
use test_support::Proxy;

/// The clients' connect and response timeouts.
const TIMEOUT: Duration = Duration::from_millis(300);
/// The longest one call may take, its retries included: connect + response
/// timeout.
const DEADLINE: Duration = Duration::from_millis(600);
/// A call that fails does so within this (the deadline plus slack for a
/// loaded 2-core machine running debug builds).
const BOUND: Duration = Duration::from_millis(1500);
/// A call made once a fault is over succeeds within this (it needs a round
/// trip or a reconnect; slack for a loaded 2-core machine). A client that
/// still suffers from the fault fails the call instead, at its deadline.
const RECOVERED: Duration = Duration::from_millis(1500);
/// A waiter takes a lock freed while its connections were closed within
/// this: its next refresh (500 ms), a reconnect, slack for a loaded
/// machine. A waiter that missed the release and never tries again waits
/// until its wait (10 s and more here) ends.
const WOKEN: Duration = Duration::from_secs(4);
/// A lock that would block everyone for this long if it were orphaned.
const LONG_TTL: Duration = Duration::from_secs(30);
/// After a fault ends, a lock still held by nobody is deleted within this
/// (background retries back off to 1 s and each try may take a deadline;
/// slack for a loaded machine): well below `LONG_TTL`, which an orphan
/// would last.
const RETRY_WINDOW: Duration = Duration::from_secs(15);

fn client(url: String) -> Client {
    Client::new(
        Config::new(url)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT),
    )
    .unwrap()
}

/// A client whose connections go through `proxy`.
fn through(proxy: &Proxy) -> Client {
    client(proxy.url())
}

/// A client that talks to the server directly, past every fault: another
/// instance on a healthy network.
fn direct(server: &RedisServer) -> Client {
    client(server.url())
}

fn lock_key(name: &str) -> String {
    format!("lock:{{{name}}}")
}

fn exists(server: &RedisServer, name: &str) -> bool {
    redis(server, &["EXISTS", &lock_key(name)]) == ":1\r\n"
}

/// The key's remaining time to live in milliseconds (-2: no key).
fn pttl(server: &RedisServer, name: &str) -> i64 {
    value(&redis(server, &["PTTL", &lock_key(name)]))
        .unwrap()
        .parse()
        .unwrap()
}

/// Script calls Redis ran so far (EVALSHA and EVAL): a waiter's attempts.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = redis(server, &["INFO", "commandstats"]);
    ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
        .iter()
        .filter_map(|field| {
            let at = stats.find(field)? + field.len();
            stats[at..].split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A waiter is queued for the lock `name`.
fn queued(server: &RedisServer, name: &str) -> bool {
    redis(server, &["LLEN", &format!("{}:queue", lock_key(name))]) != ":0\r\n"
}

/// Waits until the lock key `name` is gone, which must happen within
/// `within` (far below the ttl it was set with).
async fn assert_gone_within(server: &RedisServer, name: &str, within: Duration) {
    let what = format!("the lock key {} is deleted", lock_key(name));
    wait_until_async(&what, within, || !exists(server, name)).await;
}

/// Another instance, on a healthy network, can take the lock at once.
async fn assert_free(server: &RedisServer, name: &str) {
    let other = Lock::new(name).client(direct(server));
    let guard = other.try_acquire().await.expect("the lock is free");
    guard.release().await.unwrap();
}

fn assert_redis_error(error: &LockError) {
    assert!(
        matches!(error, LockError::Redis { .. }),
        "expected a Redis error, got {error:?}"
    );
}

/// A release that failed says it goes on in the background.
fn assert_retried_in_background(error: &LockError) {
    assert_redis_error(error);
    assert!(
        error.to_string().contains("retried in the background"),
        "the error does not say the release goes on: {error}"
    );
}

// ---------------------------------------------------------------------------
// 1. Connections closed while idle fail nothing.

/// Old behaviour: the release after `drop_all` failed with "broken pipe" and
/// the key stayed, held by nobody, for its whole ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_connection_was_dropped_frees_the_lock_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lock = Lock::new("dropped").ttl(LONG_TTL).client(through(&proxy));
    for round in 0..3 {
        // The acquire meets a connection closed while idle (from round 1).
        let guard = lock.acquire().await.unwrap_or_else(|error| {
            panic!("round {round}: acquire after the connection was dropped: {error}")
        });
        assert!(exists(&server, "dropped"));
        proxy.drop_all();
        wait_until_async("the proxy closed its connections", BOUND, || {
            proxy.connections() == 0
        })
        .await;
        let started = Instant::now();
        guard.release().await.unwrap_or_else(|error| {
            panic!("round {round}: release after the connection was dropped: {error}")
        });
        assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
        assert!(
            !exists(&server, "dropped"),
            "round {round}: key left behind"
        );
        assert_free(&server, "dropped").await;
        proxy.drop_all();
        wait_until_async("the proxy closed its connections", BOUND, || {
            proxy.connections() == 0
        })
        .await;
    }
}

/// A proxy that closes connections idle for 100 ms: the acquire, the
/// release and the renewals (every 200 ms for a 600 ms ttl) each meet a
/// connection closed since the last call, and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeouts_fail_no_acquire_release_or_renewal() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_idle_timeout(Some(Duration::from_millis(100)));
    let client = through(&proxy);

    let plain = Lock::new("plain").ttl(LONG_TTL).client(client.clone());
    for round in 0..3 {
        if round > 0 {
            wait_until_async("the idle connection is closed", BOUND, || {
                proxy.connections() == 0
            })
            .await;
        }
        let guard = plain
            .acquire()
            .await
            .unwrap_or_else(|error| panic!("round {round}: acquire after an idle close: {error}"));
        wait_until_async("the idle connection is closed", BOUND, || {
            proxy.connections() == 0
        })
        .await;
        guard
            .release()
            .await
            .unwrap_or_else(|error| panic!("round {round}: release after an idle close: {error}"));
        assert!(!exists(&server, "plain"), "round {round}: key left behind");
    }

    let renewed = Lock::new("renewed")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let accepted = proxy.accepted();
    let sent = client.renewal_stats().renewals_sent;
    let started = Instant::now();
    // Held, checked throughout, for 2.5 ttls and until 5 renewals went out
    // and 3 of them met a connection the idle timeout had closed.
    assert_held_until(&server, &renewed, || {
        started.elapsed() >= Duration::from_millis(1500)
            && proxy.accepted() >= accepted + 3
            && client.renewal_stats().renewals_sent >= sent + 5
    })
    .await;
    assert!(renewed.is_held(), "lost: {:?}", renewed.lost_cause());
    renewed.release().await.unwrap();
    assert!(!exists(&server, "renewed"));
}

/// `CLIENT KILL TYPE normal` on the server closes the lock connection; the
/// next acquire and release succeed. (The default timeouts: what is tested
/// is that no operation fails, not how fast the reconnect is, which on a
/// loaded 2-core CI machine once took more than the 600 ms of the other
/// tests' deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_fails_no_operation() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let lock = Lock::new("killed").ttl(LONG_TTL).client(client);
    for round in 0..3 {
        let guard = lock
            .acquire()
            .await
            .unwrap_or_else(|error| panic!("round {round}: acquire after CLIENT KILL: {error}"));
        let killed = redis(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
        assert_ne!(killed, ":0\r\n", "CLIENT KILL closed nothing");
        guard
            .release()
            .await
            .unwrap_or_else(|error| panic!("round {round}: release after CLIENT KILL: {error}"));
        assert!(!exists(&server, "killed"), "round {round}: key left behind");
        redis(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
    }
}

// ---------------------------------------------------------------------------
// 2. A release that still fails is retried in the background.

/// Old behaviour: no background retry; the key stayed until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_times_out_is_retried_in_the_background() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let guard = Lock::new("stalled")
        .ttl(LONG_TTL)
        .client(through(&proxy))
        .acquire()
        .await
        .unwrap();
    proxy.stall();
    let started = Instant::now();
    let error = guard.release().await.expect_err("the proxy is stalled");
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    assert_retried_in_background(&error);
    // Close the stalled connections: the release they carry never reaches
    // Redis, so only a retry can delete the key.
    proxy.drop_all();
    tokio::time::sleep(Duration::from_millis(300)).await; // the fault lasts
    assert!(exists(&server, "stalled"));
    proxy.resume();
    assert_gone_within(&server, "stalled", RETRY_WINDOW).await;
    assert_free(&server, "stalled").await;
}

/// Redis down (connections refused) for a second: the release fails, then
/// goes through once Redis is back, well before the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_retried_until_redis_is_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let guard = Lock::new("refused")
        .ttl(LONG_TTL)
        .client(through(&proxy))
        .acquire()
        .await
        .unwrap();
    proxy.refuse(true);
    proxy.drop_all();
    let started = Instant::now();
    let error = guard.release().await.expect_err("Redis is unreachable");
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    assert_retried_in_background(&error);
    tokio::time::sleep(Duration::from_secs(1)).await; // the outage lasts
    assert!(
        pttl(&server, "refused") > 25_000,
        "deleted during the outage?"
    );
    proxy.refuse(false);
    assert_gone_within(&server, "refused", RETRY_WINDOW).await;
    assert_free(&server, "refused").await;
}

/// A guard dropped while Redis is unreachable: same as a failed release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_once_redis_is_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let guard = Lock::new("dropped-guard")
        .ttl(LONG_TTL)
        .client(through(&proxy))
        .acquire()
        .await
        .unwrap();
    proxy.refuse(true);
    proxy.drop_all();
    drop(guard);
    tokio::time::sleep(Duration::from_millis(1500)).await; // the outage lasts
    assert!(exists(&server, "dropped-guard"));
    proxy.refuse(false);
    assert_gone_within(&server, "dropped-guard", RETRY_WINDOW).await;
    assert_free(&server, "dropped-guard").await;
}

// ---------------------------------------------------------------------------
// 3. Stalled connections: calls fail at their deadline, and a timed-out
//    connection is replaced.

/// A stall fails the call at its deadline, not later; after the stall the
/// next call succeeds promptly, and the acquire that timed out (its `SET`
/// may reach Redis once the stall ends) leaves no orphan behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_fails_calls_at_their_deadline_then_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = through(&proxy);
    // Open the connection.
    warm_up(&client).await;
    let open_before = proxy.connections();

    proxy.stall();
    let started = Instant::now();
    let error = Lock::new("timed-out")
        .ttl(LONG_TTL)
        .client(client.clone())
        .try_acquire()
        .await
        .expect_err("the proxy is stalled");
    let took = started.elapsed();
    assert_redis_error(&error);
    assert!(
        took >= DEADLINE - Duration::from_millis(50) && took < BOUND,
        "failed after {took:?}, not at its deadline of {DEADLINE:?}"
    );
    proxy.resume();

    let started = Instant::now();
    let guard = Lock::new("after")
        .ttl(LONG_TTL)
        .client(client.clone())
        .try_acquire()
        .await
        .expect("the stall is over");
    assert!(
        started.elapsed() < RECOVERED,
        "took {:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
    assert!(!exists(&server, "after"));
    // The timed-out acquire's `SET` waited in the stalled connection, which
    // the client gave up: it reaches Redis when the proxy carries what that
    // connection held and closes it. Until then the key may be absent
    // and appear later, so wait for that first (the proxy back to the
    // connections it had before the stall).
    wait_until_async(
        "the proxy closed the stalled connection",
        RETRY_WINDOW,
        || proxy.connections() <= open_before,
    )
    .await;
    // No orphan: whatever the timed-out acquire did, its key is gone soon.
    assert_gone_within(&server, "timed-out", RETRY_WINDOW).await;
    assert_free(&server, "timed-out").await;
}

/// A connection that stays stalled for good (a peer gone without a reset)
/// while new connections work: after one call times out on it, the next
/// call runs on a fresh connection. Old behaviour: every later call waited
/// behind the stalled one and timed out too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stays_stalled_is_replaced() {
    let server = RedisServer::start();
    let freezer = Freezer::start(server.port());
    let client = client(freezer.url());
    warm_up(&client).await;

    freezer.freeze_existing();
    let started = Instant::now();
    let error = Lock::new("frozen")
        .client(client.clone())
        .try_acquire()
        .await
        .expect_err("the connection is frozen");
    assert_redis_error(&error);
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());

    for round in 0..3 {
        let started = Instant::now();
        let guard = Lock::new("fresh")
            .ttl(LONG_TTL)
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap_or_else(|error| {
                panic!("round {round}: call after a timed-out connection: {error}")
            });
        assert!(
            started.elapsed() < RECOVERED,
            "took {:?}",
            started.elapsed()
        );
        guard.release().await.unwrap();
        assert!(!exists(&server, "fresh"));
    }
    assert!(!exists(&server, "frozen"), "the frozen SET reached Redis?");
    assert!(freezer.connections() >= 2, "no fresh connection was opened");
}

// ---------------------------------------------------------------------------
// 4. Renewal under faults.

const RENEWED_TTL: Duration = Duration::from_millis(600);

/// Holds `guard` for `window`, checking throughout that it is held and that
/// another instance finds the lock busy.
async fn assert_held_throughout(
    server: &RedisServer,
    guard: &lock_runtime::LockGuard,
    window: Duration,
) {
    let started = Instant::now();
    assert_held_until(server, guard, || started.elapsed() >= window).await;
}

/// Holds `guard` until `done` (within [`LINE_TIMEOUT`]), checking throughout
/// that it is held and that another instance finds the lock busy.
async fn assert_held_until(
    server: &RedisServer,
    guard: &lock_runtime::LockGuard,
    mut done: impl FnMut() -> bool,
) {
    let other = Lock::new(guard.name()).client(direct(server));
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < LINE_TIMEOUT,
            "not done within {LINE_TIMEOUT:?}"
        );
        assert!(
            guard.is_held(),
            "lost after {:?}: {:?}",
            started.elapsed(),
            guard.lost_cause()
        );
        match other.try_acquire().await {
            Err(LockError::Busy { .. }) => {}
            Ok(_) => panic!("another instance took a lock that is still held"),
            Err(error) => panic!("unexpected error: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_survives_connection_drops_every_200ms() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    let client = through(&proxy);
    let guard = Lock::new("renewed")
        .ttl(RENEWED_TTL)
        .renew()
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drops = Arc::new(AtomicU64::new(0));
    let dropper = {
        let (proxy, stop, drops) = (Arc::clone(&proxy), Arc::clone(&stop), Arc::clone(&drops));
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                proxy.drop_all();
                drops.fetch_add(1, SeqCst);
            }
        })
    };
    // Held, checked throughout, while 10 drops happen and 8 renewals go out.
    let sent = client.renewal_stats().renewals_sent;
    assert_held_until(&server, &guard, || {
        drops.load(SeqCst) >= 10 && client.renewal_stats().renewals_sent >= sent + 8
    })
    .await;
    stop.store(true, SeqCst);
    dropper.join().unwrap();
    assert!(guard.is_held(), "lost: {:?}", guard.lost_cause());
    guard.release().await.unwrap();
    assert!(!exists(&server, "renewed"));
}

/// Latency of 80 ms each way (a 160 ms round trip, under a third of the
/// ttl) added while the lock is held: the renewals keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_holds_under_latency_below_a_third_of_the_ttl() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = through(&proxy);
    let guard = Lock::new("slow")
        .ttl(RENEWED_TTL)
        .renew()
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    // The connection is open and the renewal and release scripts loaded
    // (a script call that finds the script missing costs three round
    // trips: see the cold-start case below).
    wait_until_async("a renewal was confirmed", BOUND, || {
        client.renewal_stats().renewals_sent >= 2
    })
    .await;
    warm_up(&client).await;
    proxy.set_latency(Duration::from_millis(80));
    let sent = client.renewal_stats().renewals_sent;
    // Held, checked throughout, for 2 s (over 3 ttls) and 6 renewals.
    let started = Instant::now();
    assert_held_until(&server, &guard, || {
        started.elapsed() >= Duration::from_secs(2)
            && client.renewal_stats().renewals_sent >= sent + 6
    })
    .await;
    let started = Instant::now();
    guard.release().await.unwrap();
    assert!(
        started.elapsed() < RECOVERED,
        "took {:?}",
        started.elapsed()
    );
    assert!(!exists(&server, "slow"));
}

/// The same latency from a cold start: a fresh client (its connection
/// opened by the acquire, two round trips) on a Redis whose script cache
/// does not hold the renewal script yet. The client's first renewal is sent
/// as EVAL (one round trip, and it caches the script); sent as EVALSHA, it
/// cost three (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA), was confirmed about
/// 10 one-way latencies after the acquire was sent, past the 592 ms
/// validity, and the holder was told NotRenewed although Redis renewed the
/// key in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_holds_under_latency_from_a_cold_start() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_latency(Duration::from_millis(80));
    let guard = Lock::new("cold")
        .ttl(RENEWED_TTL)
        .renew()
        .client(through(&proxy))
        .acquire()
        .await
        .unwrap();
    assert_held_throughout(&server, &guard, Duration::from_secs(2)).await;
    guard.release().await.unwrap();
    assert!(!exists(&server, "cold"));
}

/// A stall longer than the validity: the holder is told (NotRenewed) within
/// its validity, a body run under the lock is stopped, and the key is gone
/// after the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_past_the_validity_stops_the_body() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let guard = Lock::new("cut-off")
        .ttl(RENEWED_TTL)
        .renew()
        .client(through(&proxy))
        .acquire()
        .await
        .unwrap();
    let steps = Arc::new(AtomicU64::new(0));
    let body = {
        let steps = Arc::clone(&steps);
        async move {
            loop {
                steps.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let stall = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.stall();
        Instant::now()
    };
    let (outcome, stalled_at) = tokio::join!(guard.run(body), stall);
    let stopped_after = stalled_at.elapsed();
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                cause: LostCause::NotRenewed,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(
        stopped_after < RENEWED_TTL + Duration::from_millis(400),
        "stopped {stopped_after:?} after the stall began"
    );
    let taken = steps.load(SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(steps.load(SeqCst), taken, "the body went on");
    assert!(!guard.is_held());
    assert_eq!(guard.lost_cause(), Some(LostCause::NotRenewed));
    let cause = tokio::time::timeout(Duration::from_millis(200), guard.lost()).await;
    assert_eq!(cause.ok(), Some(LostCause::NotRenewed));

    proxy.resume();
    let error = guard.release().await.expect_err("the lock was lost");
    assert!(error.is_lost(), "{error:?}");
    assert_gone_within(&server, "cut-off", RETRY_WINDOW).await;
    assert_free(&server, "cut-off").await;
}

// ---------------------------------------------------------------------------
// 5. Waiters under faults.

/// Spawns a waiter for `name` (waiting `wait`) on `client`; resolves to its
/// result and when it got it.
fn spawn_waiter(
    client: &Client,
    name: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<(Result<lock_runtime::LockGuard, LockError>, Instant)> {
    let lock = Lock::new(name)
        .ttl(LONG_TTL)
        .wait(wait)
        .client(client.clone());
    tokio::spawn(async move {
        let result = lock.acquire().await;
        (result, Instant::now())
    })
}

/// Old behaviour: the waiter's next attempt failed on the dropped
/// connection, and the wait ended with a Redis error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_dropped_connections() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Lock::new("awaited")
        .ttl(LONG_TTL)
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&through(&proxy), "awaited", Duration::from_secs(10));
    wait_until_async("the waiter is queued", BOUND, || queued(&server, "awaited")).await;
    for _ in 0..2 {
        // Counted before the drop: the client may reconnect at once, on
        // seeing its connection closed, before its next refresh.
        let (accepted, attempts) = (proxy.accepted(), script_calls(&server));
        proxy.drop_all();
        // The waiter's next refresh (every 500 ms) meets the dropped
        // connection and goes through on a new one: it waits on.
        wait_until_async(
            "the waiter refreshed on a new connection",
            LINE_TIMEOUT,
            || proxy.accepted() > accepted && script_calls(&server) > attempts,
        )
        .await;
        assert!(!waiter.is_finished(), "{:?}", waiter.await);
    }
    proxy.drop_all();
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (result, acquired_at) = waiter.await.unwrap();
    let guard = result.expect("the waiter gets the lock after the release");
    assert!(
        acquired_at - released_at < WOKEN,
        "took {:?}",
        acquired_at - released_at
    );
    assert!(exists(&server, "awaited"));
    guard.release().await.unwrap();
    assert!(!exists(&server, "awaited"));
}

/// A waiter whose connections are closed when idle (100 ms) and then
/// stalled for a second, the holder releasing during the stall: the waiter
/// rides out both faults and takes the lock after the stall; nobody else
/// held it meanwhile, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_idle_closes_and_a_stall() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Lock::new("stalled-wait")
        .ttl(LONG_TTL)
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    proxy.set_idle_timeout(Some(Duration::from_millis(100)));
    let waiter = spawn_waiter(&through(&proxy), "stalled-wait", Duration::from_secs(15));
    wait_until_async("the waiter is queued", BOUND, || {
        queued(&server, "stalled-wait")
    })
    .await;
    // Its connections are closed between its attempts (500 ms apart): two
    // of them reconnect.
    let accepted = proxy.accepted();
    wait_until_async("the waiter reconnected twice", LINE_TIMEOUT, || {
        proxy.accepted() >= accepted + 2
    })
    .await;
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    proxy.set_idle_timeout(None);
    proxy.stall();
    holder.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await; // the stall lasts
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    assert!(
        !exists(&server, "stalled-wait"),
        "someone took it during the stall"
    );
    let resumed_at = Instant::now();
    proxy.resume();
    let (result, acquired_at) = waiter.await.unwrap();
    let guard = result.expect("the waiter gets the lock after the stall");
    assert!(
        acquired_at - resumed_at < WOKEN,
        "took {:?} after the stall",
        acquired_at - resumed_at
    );
    guard.release().await.unwrap();
    assert_gone_within(&server, "stalled-wait", RETRY_WINDOW).await;
}

/// A lock a waiter takes after riding out an outage or a stall is valid
/// from the attempt that took it, not from an older attempt whose answer
/// was lost: a renewed body runs, and the hold is renewed. (It was reported
/// lost at once, `NotRenewed`, its body never run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_after_a_fault_during_the_wait_is_valid() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    for stall in [false, true] {
        let name = if stall { "after-stall" } else { "after-outage" };
        let holder = Lock::new(name)
            .client(direct(&server))
            .acquire()
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let lock = Lock::new(name)
                .ttl(Duration::from_secs(2))
                .renew()
                .wait(Duration::from_secs(20))
                .client(through(&proxy));
            async move {
                lock.run(async {
                    let held = lock_runtime::current().unwrap();
                    (held.is_held(), held.remaining())
                })
                .await
            }
        });
        wait_until_async("the waiter is queued", BOUND, || queued(&server, name)).await;
        if stall {
            proxy.stall();
        } else {
            proxy.refuse(true);
            proxy.drop_all();
        }
        tokio::time::sleep(Duration::from_millis(1500)).await; // the fault lasts
        holder.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        if stall {
            proxy.resume();
        } else {
            proxy.refuse(false);
        }
        let (held, remaining) = waiter
            .await
            .unwrap()
            .expect("the body runs under the lock it got");
        assert!(held, "{name}: held at once");
        assert!(
            remaining > Duration::from_secs(1),
            "{name}: only {remaining:?} of a 2 s ttl left"
        );
        assert_gone_within(&server, name, RETRY_WINDOW).await;
    }
}

/// Redis unreachable for 1.5 s of a 5 s wait: the waiter keeps trying and
/// takes the lock once Redis is back. Old behaviour: it failed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_outlasts_an_outage_shorter_than_its_wait() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Lock::new("outage")
        .ttl(LONG_TTL)
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&through(&proxy), "outage", Duration::from_secs(5));
    wait_until_async("the waiter is queued", BOUND, || queued(&server, "outage")).await;
    proxy.refuse(true);
    proxy.drop_all();
    holder.release().await.unwrap(); // the lock is free, but out of reach
    tokio::time::sleep(Duration::from_millis(1500)).await; // the outage lasts
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    assert!(!exists(&server, "outage"));
    proxy.refuse(false);
    let back_at = Instant::now();
    let (result, acquired_at) = waiter.await.unwrap();
    let guard = result.expect("the waiter gets the lock once Redis is back");
    assert!(
        acquired_at - back_at < Duration::from_millis(2500),
        "took {:?}",
        acquired_at - back_at
    );
    assert!(exists(&server, "outage"));
    guard.release().await.unwrap();
    assert!(!exists(&server, "outage"));
}

/// An outage that outlasts the wait: the waiter fails with the Redis error
/// (not WaitTimeout, which would blame a holder) after about its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_facing_a_longer_outage_fails_with_the_redis_error() {
    const WAIT: Duration = Duration::from_millis(1500);
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = Lock::new("long-outage")
        .ttl(LONG_TTL)
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = spawn_waiter(&through(&proxy), "long-outage", WAIT);
    wait_until_async("the waiter is queued", BOUND, || {
        queued(&server, "long-outage")
    })
    .await;
    proxy.refuse(true);
    proxy.drop_all();
    let (result, ended_at) = waiter.await.unwrap();
    let error = result.expect_err("Redis is unreachable for the whole wait");
    assert_redis_error(&error);
    let waited = ended_at - started;
    assert!(
        waited >= WAIT - Duration::from_millis(550) && waited < WAIT + BOUND,
        "gave up after {waited:?}, not after about its wait of {WAIT:?}"
    );
    proxy.refuse(false);
    holder.release().await.unwrap();
    assert!(!exists(&server, "long-outage"));
}

// ---------------------------------------------------------------------------
// 6. No two holders under faults.

/// 4 instances (each through its own proxy) × 2 tasks run 200 sections of a
/// non-atomic read-increment-write on a counter, while every connection of
/// every proxy is dropped every 50 ms. The counter ends exact, no section
/// overlapped another, and no lock key is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_holders_while_connections_drop() {
    const INSTANCES: usize = 4;
    const TASKS_PER_INSTANCE: usize = 2;
    const SECTIONS_PER_TASK: usize = 25;
    let server = RedisServer::start();
    let proxies: Vec<Arc<Proxy>> = (0..INSTANCES)
        .map(|_| Arc::new(Proxy::start(server.port())))
        .collect();
    let bookkeeping = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drops = Arc::new(AtomicU64::new(0));
    let dropper = {
        let (proxies, stop, drops) = (proxies.clone(), Arc::clone(&stop), Arc::clone(&drops));
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
                for proxy in &proxies {
                    proxy.drop_all();
                }
                drops.fetch_add(1, SeqCst);
            }
        })
    };
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let acquire_errors = Arc::new(AtomicU64::new(0));
    let release_errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for proxy in &proxies {
        let client = through(proxy);
        for _ in 0..TASKS_PER_INSTANCE {
            let lock = Lock::new("counter")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(20))
                .client(client.clone());
            let mut bookkeeping = bookkeeping.clone();
            let (inside, overlaps) = (Arc::clone(&inside), Arc::clone(&overlaps));
            let (acquire_errors, release_errors) =
                (Arc::clone(&acquire_errors), Arc::clone(&release_errors));
            tasks.push(tokio::spawn(async move {
                for _ in 0..SECTIONS_PER_TASK {
                    let guard = loop {
                        match lock.acquire().await {
                            Ok(guard) => break guard,
                            Err(error) => {
                                let errors = acquire_errors.fetch_add(1, SeqCst) + 1;
                                assert!(errors < 50, "acquires keep failing: {error}");
                            }
                        }
                    };
                    if inside.swap(true, SeqCst) {
                        overlaps.fetch_add(1, SeqCst);
                    }
                    let count: Option<u64> = redis::cmd("GET")
                        .arg("count")
                        .query_async(&mut bookkeeping)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    let () = redis::cmd("SET")
                        .arg("count")
                        .arg(count.unwrap_or(0) + 1)
                        .query_async(&mut bookkeeping)
                        .await
                        .unwrap();
                    inside.store(false, SeqCst);
                    match guard.release().await {
                        Ok(()) => {}
                        // The lock stays held until a background retry
                        // deletes it: exclusion is not affected.
                        Err(LockError::Redis { .. }) => {
                            release_errors.fetch_add(1, SeqCst);
                        }
                        Err(error) => panic!("release: {error}"),
                    }
                }
            }));
        }
    }
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    stop.store(true, SeqCst);
    dropper.join().unwrap();
    let sections = INSTANCES * TASKS_PER_INSTANCE * SECTIONS_PER_TASK;
    eprintln!(
        "{sections} sections in {took:?}, {} drops, {} acquire errors, {} release errors",
        drops.load(SeqCst),
        acquire_errors.load(SeqCst),
        release_errors.load(SeqCst)
    );
    assert!(drops.load(SeqCst) >= 3, "too few faults to test anything");
    assert_eq!(overlaps.load(SeqCst), 0, "two holders at once");
    assert_eq!(
        value(&redis(&server, &["GET", "count"])),
        Some(sections.to_string())
    );
    // 7. No orphan: the lock key is gone once background releases ran; the
    // queue's keys expire on their own.
    assert_gone_within(&server, "counter", RETRY_WINDOW).await;
    let keys = redis(&server, &["KEYS", "lock:*"]);
    for key in keys.split("\r\n").filter(|line| line.starts_with("lock:")) {
        let ttl: i64 = value(&redis(&server, &["PTTL", key]))
            .unwrap()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{key} left behind without an expiry ({ttl})");
    }
}

// ---------------------------------------------------------------------------
// A relay whose connections can be frozen for good.

/// A minimal TCP relay to a loopback port whose current connections can be
/// frozen for good (bytes stop in both directions, nothing is closed) while
/// new connections flow: a half-dead connection beside a healthy network.
/// (`Proxy::stall` stalls every connection, new ones included.)
struct Freezer {
    port: u16,
    shared: Arc<FreezerShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct FreezerShared {
    stop: AtomicBool,
    /// One flag per connection accepted so far.
    frozen: Mutex<Vec<Arc<AtomicBool>>>,
}

const FREEZER_TICK: Duration = Duration::from_millis(5);

impl Freezer {
    fn start(upstream: u16) -> Freezer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(FreezerShared {
            stop: AtomicBool::new(false),
            frozen: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let mut pumps = Vec::new();
                while !shared.stop.load(SeqCst) {
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(FREEZER_TICK);
                        continue;
                    };
                    let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    client.set_nonblocking(false).unwrap();
                    let frozen = Arc::new(AtomicBool::new(false));
                    shared.frozen.lock().unwrap().push(Arc::clone(&frozen));
                    let ends = [
                        (client.try_clone().unwrap(), upstream.try_clone().unwrap()),
                        (upstream, client),
                    ];
                    for (from, to) in ends {
                        let (shared, frozen) = (Arc::clone(&shared), Arc::clone(&frozen));
                        pumps.push(std::thread::spawn(move || {
                            relay(&shared, &frozen, from, to)
                        }));
                    }
                }
                for pump in pumps {
                    let _ = pump.join();
                }
            })
        };
        Freezer {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Freezes every connection accepted so far; later ones flow.
    fn freeze_existing(&self) {
        for frozen in self.shared.frozen.lock().unwrap().iter() {
            frozen.store(true, SeqCst);
        }
    }

    /// Connections accepted so far.
    fn connections(&self) -> usize {
        self.shared.frozen.lock().unwrap().len()
    }
}

/// Copies `from` to `to` until either end closes, the connection is frozen
/// (then it holds everything until the relay stops) or the relay stops.
fn relay(shared: &FreezerShared, frozen: &AtomicBool, mut from: TcpStream, mut to: TcpStream) {
    from.set_read_timeout(Some(FREEZER_TICK)).unwrap();
    let mut buffer = [0u8; 16 * 1024];
    while !shared.stop.load(SeqCst) {
        if frozen.load(SeqCst) {
            std::thread::sleep(FREEZER_TICK);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => {
                // Frozen while this read waited: the bytes go nowhere.
                if frozen.load(SeqCst) {
                    continue;
                }
                if to.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Drop for Freezer {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Opens the client's connection and has Redis run its scripts once (a
/// plain and a waiting acquire, a release), so that a fault injected next
/// meets a warm client.
async fn warm_up(client: &Client) {
    // A client with short timeouts (`impatient`: 300 ms a call) may see its
    // first calls time out on a loaded machine (a connection to make):
    // tried again, under another name each time (a timed-out attempt may
    // still take its lock), until both succeed.
    let deadline = Instant::now() + LINE_TIMEOUT;
    for round in 0.. {
        let lock = Lock::new(format!("warm-{round}")).client(client.clone());
        let plain = match lock.acquire().await {
            Ok(guard) => guard.release().await,
            Err(error) => Err(error),
        };
        let waiting = match plain {
            Ok(()) => lock.wait(Duration::from_millis(10)).run(async {}).await,
            Err(error) => Err(error),
        };
        match waiting {
            Ok(()) => return,
            Err(error) => assert!(
                Instant::now() < deadline,
                "the client never warmed up: {error}"
            ),
        }
    }
}

/// A client whose calls give up after 150 + 150 ms, for attempts that a
/// 1.5 s latency turns into timeouts.
fn impatient(proxy: &Proxy) -> Client {
    Client::new(
        Config::new(proxy.url())
            .connect_timeout(Duration::from_millis(150))
            .response_timeout(Duration::from_millis(150)),
    )
    .unwrap()
}

/// An acquire attempt that timed out lands late, after a later attempt of
/// the same acquisition was answered "busy" and the acquisition gave up:
/// the late attempt takes the lock with a token nobody holds. The
/// acquisition's cleanup keeps checking for that token while such a lock
/// could matter, so the lock is free again long before its 10 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_of_a_finished_acquisition_leaves_no_lock() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    let a = impatient(&proxy);
    // Warm A's connection and scripts.
    warm_up(&a).await;
    let held_by_b = Lock::new("ghost")
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    proxy.set_latency(Duration::from_millis(1500));
    let started = Instant::now();
    let un_delay = {
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            proxy.set_latency(Duration::ZERO);
        })
    };
    let outcome = Lock::new("ghost")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_millis(700))
        .client(a.clone())
        .acquire()
        .await;
    assert!(
        matches!(outcome, Err(LockError::WaitTimeout { .. })),
        "{outcome:?}"
    );
    un_delay.await.unwrap();
    held_by_b.release().await.unwrap();
    // The first attempt, sent at 0 with 1.5 s of latency, lands about now.
    tokio::time::sleep(Duration::from_millis(1700).saturating_sub(started.elapsed())).await;
    let c = direct(&server);
    let waited = Instant::now();
    Lock::new("ghost")
        .wait(Duration::from_secs(15))
        .client(c)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Its ttl is 10 s: a lock left behind blocks the waiter about 10 s.
    assert!(
        waited.elapsed() < Duration::from_secs(6),
        "a lock nobody holds blocked a waiter for {:?}",
        waited.elapsed()
    );
}

/// A timed-out attempt that lands late and is then recognised by a later
/// attempt of the same acquisition ("mine"): the holder's validity ends no
/// later than the key does, so another client can never take the lock
/// while the first still believes it holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_found_taken_by_a_late_attempt_is_valid_no_longer_than_its_key() {
    let server = Arc::new(RedisServer::start());
    let proxy = Arc::new(Proxy::start(server.port()));
    let a = impatient(&proxy);
    warm_up(&a).await;
    let _held_by_b = Lock::new("v")
        .client(direct(&server))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    proxy.set_latency(Duration::from_millis(1500));
    let faults = {
        let (proxy, server) = (Arc::clone(&proxy), Arc::clone(&server));
        tokio::spawn(async move {
            let at = |ms| tokio::time::sleep_until((started + Duration::from_millis(ms)).into());
            at(200).await;
            proxy.set_latency(Duration::ZERO);
            at(1400).await;
            // B's key goes (as by expiry), publishing nothing.
            server.command(&["DEL", "lock:{v}"]).unwrap();
            at(1600).await;
            proxy.set_latency(Duration::from_millis(3000));
            at(2000).await;
            proxy.set_latency(Duration::ZERO);
        })
    };
    let c = direct(&server);
    let c_task = tokio::spawn(async move {
        tokio::time::sleep_until((started + Duration::from_millis(1550)).into()).await;
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            if let Ok(guard) = Lock::new("v").client(c.clone()).try_acquire().await {
                return (Instant::now(), guard);
            }
            assert!(Instant::now() < deadline, "C never got the lock");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    // `fair`: every attempt, the first included, is the queue script of
    // one waiting acquisition (a plain waiting acquire tries a bare SET NX
    // first, outside it).
    let guard = Lock::new("v")
        .fair()
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(5))
        .client(a.clone())
        .acquire()
        .await
        .unwrap();
    let a_valid_until = Instant::now() + guard.remaining();
    let (c_acquired, c_guard) = c_task.await.unwrap();
    assert!(
        c_acquired >= a_valid_until,
        "C took the lock {:?} before A's validity ended",
        a_valid_until - c_acquired
    );
    faults.await.unwrap();
    drop(guard);
    c_guard.release().await.unwrap();
}

/// A reentrant body moved to another task is stopped as soon as its outer
/// hold's release starts, not when the release's reply comes back (400 ms
/// later here), by which time another client may hold the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_reentrant_body_stops_when_the_release_starts() {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    let a = Client::new(Config::new(proxy.url()).response_timeout(Duration::from_secs(5))).unwrap();
    let lock = Lock::new("window").client(a);
    let b_holds = Arc::new(AtomicBool::new(false));
    let overlap = Arc::new(AtomicU64::new(0));
    let b = {
        let (b_holds, lock) = (
            Arc::clone(&b_holds),
            Lock::new("window").client(direct(&server)),
        );
        async move {
            let deadline = Instant::now() + LINE_TIMEOUT;
            loop {
                assert!(Instant::now() < deadline, "B never got the lock");
                if let Ok(guard) = lock.try_acquire().await {
                    b_holds.store(true, SeqCst);
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    b_holds.store(false, SeqCst);
                    guard.release().await.unwrap();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let (inner, b) = lock
        .run({
            let (lock, b_holds, overlap, proxy) = (
                lock.clone(),
                Arc::clone(&b_holds),
                Arc::clone(&overlap),
                Arc::clone(&proxy),
            );
            async move {
                let mut inner = Box::pin(async move {
                    lock.run(async move {
                        loop {
                            if b_holds.load(SeqCst) {
                                overlap.fetch_add(1, SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await
                });
                // Started here, then moved to another task.
                tokio::select! {
                    _ = &mut inner => unreachable!(),
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
                let inner = tokio::spawn(inner);
                let b = tokio::spawn(b);
                proxy.set_latency(Duration::from_millis(400));
                (inner, b)
            }
        })
        .await
        .unwrap();
    let inner = inner.await.unwrap();
    b.await.unwrap();
    assert!(
        matches!(
            inner,
            Err(LockError::Lost {
                cause: LostCause::Released,
                ..
            })
        ),
        "{inner:?}"
    );
    assert_eq!(
        overlap.load(SeqCst),
        0,
        "the reentrant body ran while another client held the lock"
    );
}

/// Issue 36, hole 8: a waiting lock on a stalled connection ends one call
/// deadline after its wait, not two (design §3). The proxy stalls (the
/// connection stays open, nothing passes; connect 1 s + response 1 s, so a
/// call deadline of 2 s); a lock with a 300 ms wait, acquired by hand and
/// by `run`, fails with the Redis error within 300 ms + 2 s, plus slack.
/// Before, the first attempt (`SET NX`) timed out at 2 s, then a waiting
/// attempt was sent though the wait was over, on a new connection through
/// the stalled proxy: 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_on_a_stalled_connection_ends_one_deadline_after_its_wait() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::new(
        Config::new(proxy.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let deadline = Duration::from_secs(2);
    warm_up(&client).await;
    proxy.stall();
    let wait = Duration::from_millis(300);
    let lock = Lock::new("stalled-wait")
        .ttl(LONG_TTL)
        .wait(wait)
        .client(client.clone());
    for by_run in [false, true] {
        let started = Instant::now();
        let result = if by_run {
            lock.run(async {}).await
        } else {
            lock.acquire().await.map(drop)
        };
        let took = started.elapsed();
        let error = result.expect_err("the proxy is stalled");
        assert_redis_error(&error);
        assert!(
            took < wait + deadline + Duration::from_secs(1),
            "by_run {by_run}: failed after {took:?}, its wait {wait:?} and a call deadline \
             {deadline:?}"
        );
    }
    proxy.resume();
    // Whatever the timed-out attempts did, the lock is free again soon.
    assert_gone_within(&server, "stalled-wait", RETRY_WINDOW).await;
}
