//! The renewal driver and the loss semantics, in one process with its own
//! client: max_hold, drop, panic, current(), on_lost, batching.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{current, Client, Config, ConfigError, Lock, LockError, LostCause, OnLost};

/// The test locks' ttl: renewed every ~333 ms, a lock is lost only when its
/// renewal driver is held up ~670 ms (300 ms was reached on a loaded 2-core
/// machine, with blocking checks on a current-thread runtime beside it).
const TTL: Duration = Duration::from_secs(1);

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
        // Deleted while the holder's validity had time: not expired.
        Err(LockError::Lost {
            cause: LostCause::Deleted,
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
    assert_eq!(result, (false, Some(LostCause::Deleted)));
}

#[tokio::test]
async fn the_guard_says_when_the_lock_is_lost() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = renewed(&client, "watched").acquire().await.unwrap();
    redis(&server, &["DEL", "lock:{watched}"]);
    assert_eq!(guard.lost().await, LostCause::Deleted);
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
    assert!(
        matches!(capped, Err(LockError::Config(ConfigError::InvalidLockOption { option: "max_hold", ref reason, .. })) if reason.contains("renew"))
    );
    let continued = Lock::new("x")
        .on_lost(OnLost::Continue)
        .client(client)
        .acquire()
        .await;
    assert!(matches!(
        continued,
        Err(LockError::Config(ConfigError::InvalidLockOption {
            option: "on_lost",
            ..
        }))
    ));
}

/// `hold_at_least` with `renew`: a renewal that reaches Redis after the
/// release (re-sent after a NOSCRIPT reload, or already on the wire) must
/// not extend the kept lock again, which would cut its minimum hold to one
/// ttl. The script cache is flushed before each release, so that renewals
/// in flight are re-sent after loading the script, as in the issue's
/// reproduction (256 of 1,000 kept locks cut short on the old code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_is_never_extended_by_a_late_renewal() {
    let server = RedisServer::start();
    let client = client(&server);
    /// Rounds: at least this many, and on until half as many released
    /// locks were kept (a 30 ms lock can be lost on a loaded machine: it
    /// keeps nothing), within `LINE_TIMEOUT`.
    const ROUNDS: usize = 200;
    let hold_at_least = Duration::from_secs(30);
    let mut kept = Vec::new();
    let started = Instant::now();
    let mut round = 0;
    while round < ROUNDS || kept.len() < ROUNDS / 2 {
        assert!(
            started.elapsed() < LINE_TIMEOUT,
            "only {} of {round} releases kept their lock",
            kept.len()
        );
        let guard = Lock::new(format!("job:{round}"))
            .ttl(Duration::from_millis(30))
            .renew()
            .hold_at_least(hold_at_least)
            .client(client.clone())
            .acquire()
            .await
            .unwrap();
        // Land the release at varying points of the 10 ms renewal cycle.
        tokio::time::sleep(Duration::from_micros(9_000 + 700 * (round as u64 % 10))).await;
        redis(&server, &["SCRIPT", "FLUSH"]);
        match guard.release().await {
            Ok(()) => kept.push(round),
            // A 30 ms renewed lock can be lost on a loaded machine (its
            // validity ran out): then nothing was kept, and nothing to check.
            Err(LockError::Lost { .. }) => {}
            Err(error) => panic!("{error}"),
        }
        round += 1;
    }
    // Renewals sent around the last releases have landed by now: nothing
    // is renewed any more, and a lock renewed on the same connection since
    // has had three renewals answered one after the other (a late renewal
    // re-sent after NOSCRIPT takes two round trips).
    wait_until_async("every kept lock's renewal stopped", LINE_TIMEOUT, || {
        client.renewal_stats().active == 0
    })
    .await;
    let probe = Lock::new("probe")
        .ttl(Duration::from_millis(450))
        .renew()
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let sent = client.renewal_stats().renewals_sent;
    wait_for_renewals(&client, sent + 4).await;
    probe.release().await.unwrap();
    let mut cut_short = Vec::new();
    for &round in &kept {
        let key = format!("lock:{{job:{round}}}");
        let pttl: i64 = value(&redis(&server, &["PTTL", &key]))
            .unwrap()
            .parse()
            .unwrap();
        // Kept for the rest of 30 s: far more than the 30 ms ttl.
        if pttl < 20_000 {
            cut_short.push((round, pttl));
        }
    }
    assert!(
        cut_short.is_empty(),
        "{} of {} kept locks had their minimum hold cut short by a late renewal: {:?}",
        cut_short.len(),
        kept.len(),
        &cut_short[..cut_short.len().min(10)]
    );
    assert_eq!(client.renewal_stats().active, 0);
}

/// Renewal load follows ttl/3 for small ttls too: a 30 ms lock is renewed
/// about every 10 ms (at most every two thirds of that when coalesced), not
/// again and again (~14,000 renewals a second on the old code). Measured
/// over 1 s of holding in all: on a loaded machine a 30 ms lock can be lost
/// (its driver held up a ttl), its renewals stop with it, and the measure
/// goes on with a new lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_load_follows_the_ttl_for_small_ttls() {
    const SMALL: Duration = Duration::from_millis(30);
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("small").ttl(SMALL).renew().client(client.clone());
    let (mut measured, mut renewals, mut locks) = (Duration::ZERO, 0u64, 0u64);
    let deadline = Instant::now() + LINE_TIMEOUT;
    while measured < Duration::from_secs(1) {
        assert!(
            Instant::now() < deadline,
            "30 ms locks were held only {measured:?} in all within {LINE_TIMEOUT:?}"
        );
        let guard = lock.acquire().await.unwrap();
        locks += 1;
        let before = client.renewal_stats().renewals_sent;
        let started = Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1) - measured) => {} // the window measured
            _ = guard.lost() => {}
        }
        let elapsed = started.elapsed();
        let sent = client.renewal_stats().renewals_sent - before;
        if guard.is_held() {
            // Still valid: it was renewed at least once per ttl (each
            // renewal is valid a ttl from when it was sent).
            let needed = (elapsed.as_millis() / SMALL.as_millis()) as u64;
            assert!(
                sent + 2 >= needed,
                "held {elapsed:?} with {sent} renewals of a 30 ms lock"
            );
        }
        match guard.release().await {
            Ok(()) | Err(LockError::Lost { .. }) => {}
            Err(error) => panic!("{error}"),
        }
        measured += elapsed;
        renewals += sent;
    }
    // Nominal 100/s; 150/s when every renewal is coalesced early (a driver
    // held up renews less often, not more); plus a renewal in flight at
    // each lock's end.
    let allowed = measured.as_secs_f64() * 160.0 + 2.0 * locks as f64;
    assert!(
        renewals as f64 <= allowed,
        "{renewals} renewals in {measured:?} of holding {locks} 30 ms lock(s) (at most \
         {allowed:.0})"
    );
}

/// Durations the runtime cannot honour are rejected before anything is
/// sent: no panic after the lock is taken, no lock left held by nobody.
#[tokio::test]
async fn out_of_range_durations_are_rejected_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server);
    let base = || Lock::new("checked").client(client.clone());
    let cases = [
        ("max_hold", base().renew().max_hold(Duration::MAX)),
        (
            "max_hold",
            base()
                .renew()
                .max_hold(Duration::from_secs(100_000_000_000 * 3600)),
        ),
        ("max_hold", base().renew().max_hold(Duration::ZERO)),
        ("hold_at_least", base().hold_at_least(Duration::MAX)),
        ("ttl", base().ttl(Duration::MAX)),
        ("ttl", base().ttl(Duration::from_micros(500))),
        ("ttl", base().ttl(Duration::from_millis(2)).renew()),
        ("ttl", base().ttl(Duration::from_millis(9)).renew()),
    ];
    for (what, lock) in cases {
        for result in [lock.acquire().await, lock.try_acquire().await] {
            match result {
                Err(LockError::Config(ConfigError::InvalidTtl { .. })) if what == "ttl" => {}
                Err(LockError::Config(ConfigError::InvalidLockOption { option, .. })) => {
                    assert_eq!(option, what)
                }
                other => panic!("{what}: expected a config error, got {other:?}"),
            }
        }
        assert_eq!(redis(&server, &["EXISTS", "lock:{checked}"]), ":0\r\n");
    }
    // At the limits: accepted, and the lock works.
    let guard = base()
        .ttl(Duration::from_millis(10))
        .renew()
        .max_hold(Duration::from_secs(365 * 24 * 3600))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    let guard = base()
        .wait(Duration::MAX)
        .hold_at_least(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
}
