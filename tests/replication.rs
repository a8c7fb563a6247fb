//! A primary with a replica (one server, not a cluster): acknowledged mode
//! (`Config::acknowledged`: every acquisition and renewal waits for
//! replicas to confirm it with `WAIT`), with the replica stopped (SIGSTOP)
//! as the fault.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};

/// A primary and a replica of it, in sync.
fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica_port = test_support::free_port().unwrap();
    let replica = RedisServer::start_with(
        replica_port,
        &[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
            // Load the primary's data from the socket, not through a
            // dump.rdb written into the test's working directory.
            "--repl-diskless-load".to_owned(),
            "on-empty-db".to_owned(),
        ],
    )
    .unwrap();
    wait_until("the replica is in sync", LINE_TIMEOUT, || {
        redis(&replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    (primary, replica)
}

/// A client in acknowledged mode (one replica, within 200 ms), whose calls
/// may take 6 s (connect 1 s + response 5 s): a refusal within a few
/// hundred milliseconds comes from the `WAIT`'s own timeout.
fn acknowledged(primary: &RedisServer) -> Client {
    Client::new(
        Config::new(primary.url())
            .response_timeout(Duration::from_secs(5))
            .acknowledged(1, Duration::from_millis(200)),
    )
    .unwrap()
}

/// The replica has everything the primary wrote (it acknowledges at once).
fn wait_until_replicated(primary: &RedisServer, replica: &RedisServer) {
    let offset = |server: &RedisServer, field: &str| -> Option<String> {
        redis(server, &["INFO", "replication"])
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .map(str::to_owned)
    };
    wait_until("the replica caught up", LINE_TIMEOUT, || {
        redis(replica, &["INFO", "replication"]).contains("master_link_status:up")
            && offset(primary, "master_repl_offset:") == offset(replica, "slave_repl_offset:")
    });
}

/// `lock` acquired and confirmed by the replica, in sync: the replica
/// acknowledges in milliseconds, yet a loaded machine may make one
/// acknowledgement miss the 200 ms, which only refuses that acquisition
/// (`NotReplicated`, given back): it is tried again.
async fn confirmed(lock: &Lock) -> lock_runtime::LockGuard {
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        match lock.try_acquire().await {
            Ok(guard) => return guard,
            Err(LockError::NotReplicated { .. }) if Instant::now() < deadline => continue,
            Err(error) => panic!("{error:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_replicas_do_not_confirm_fails_and_is_given_back() {
    let (primary, replica) = primary_with_replica();
    let client = acknowledged(&primary);
    // Confirmed: the replica has it.
    let guard = confirmed(&Lock::new("acked").client(client.clone())).await;
    assert_eq!(
        value(&redis(&replica, &["GET", "lock:{acked}"])).as_deref(),
        Some(guard.token())
    );
    guard.release().await.unwrap();

    signal(&replica, "-STOP");
    for lock in [
        Lock::new("acked").client(client.clone()),
        Lock::new("acked").fencing().client(client.clone()),
        Lock::new("acked")
            .wait(Duration::from_secs(20))
            .client(client.clone()),
    ] {
        let started = Instant::now();
        let refused = lock.try_acquire().await;
        assert!(
            matches!(
                refused,
                Err(LockError::NotReplicated {
                    confirmed: Some(0),
                    wanted: 1,
                    ..
                })
            ),
            "{refused:?}"
        );
        // Refused by the 200 ms `WAIT`: not at the 6 s call deadline, nor
        // tried again for the 20 s wait (4 s: a loaded machine's margin).
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "refused after {:?}",
            started.elapsed()
        );
        // Given back: nobody holds it.
        assert_eq!(redis(&primary, &["EXISTS", "lock:{acked}"]), ":0\r\n");
    }
    let message = Lock::new("acked")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("0 of the 1 replicas"), "{message}");
    // Without acknowledged mode the same acquisition succeeds.
    let unacknowledged = Client::new(Config::new(primary.url())).unwrap();
    let guard = Lock::new("acked")
        .client(unacknowledged)
        .try_acquire()
        .await
        .unwrap();
    signal(&replica, "-CONT");
    guard.release().await.unwrap();
    // Confirmed again once the replica is back (and has caught up).
    wait_until_replicated(&primary, &replica);
    confirmed(&Lock::new("acked").client(client))
        .await
        .release()
        .await
        .unwrap();
}

/// The margin a holder takes off its lock's validity for clock drift (1 %
/// of the ttl + 2 ms, as `HeldLock::remaining` says).
fn drift_margin(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)).min(ttl)
}

/// Whether `guard`'s holder has had a renewal sent after `since`
/// confirmed. Its validity (`remaining`) runs from the send time of its
/// last confirmed acquire or renewal: it reaches `since + ttl` (less the
/// drift margin) only through a renewal sent after `since`.
fn renewed_since(guard: &lock_runtime::LockGuard, since: Instant) -> bool {
    let ttl = guard.ttl();
    guard.is_held() && Instant::now() + guard.remaining() >= since + ttl - drift_margin(ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_replicas_do_not_confirm_counts_as_failed_until_the_lock_is_lost() {
    let (primary, replica) = primary_with_replica();
    // Renewed every second, each renewal confirmed within 1 s (in
    // milliseconds, but for a loaded machine), tried again every 150 ms.
    let client = Client::new(
        Config::new(primary.url())
            .response_timeout(Duration::from_secs(3))
            .acknowledged(1, Duration::from_secs(1)),
    )
    .unwrap();
    let guard = confirmed(
        &Lock::new("renewed")
            .ttl(Duration::from_secs(3))
            .renew()
            .client(client.clone()),
    )
    .await;
    // Renewed, confirmed.
    let taken = Instant::now();
    wait_until_async("a renewal is confirmed", LINE_TIMEOUT, || {
        assert!(guard.is_held(), "lost with the replica up");
        renewed_since(&guard, taken)
    })
    .await;
    let failed = client.renewal_stats().failed_round_trips;
    signal(&replica, "-STOP");
    let stopped = Instant::now();
    // The primary still extends the key, but no renewal is confirmed: none
    // sent from here on extends the holder's validity, and it is told it
    // lost the lock when that runs out.
    wait_until_async("the holder is told", LINE_TIMEOUT, || {
        assert!(
            !renewed_since(&guard, stopped),
            "a renewal the stopped replica never acknowledged was counted as confirmed"
        );
        !guard.is_held()
    })
    .await;
    assert!(client.renewal_stats().failed_round_trips > failed);
    signal(&replica, "-CONT");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// Acknowledged mode: `NotReplicated` means "the primary took the lock,
/// fewer replicas confirmed it, it was given back". A busy lock (nothing
/// written) with a lagging replica is `Busy`, and a waiting acquire keeps
/// waiting until its wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_try_of_a_busy_lock_is_busy_not_unreplicated() {
    let (primary, replica) = primary_with_replica();
    let holder = Client::new(Config::new(primary.url())).unwrap();
    let held = Lock::new("busy-acked")
        .ttl(Duration::from_secs(20))
        .client(holder)
        .try_acquire()
        .await
        .unwrap();
    let acked = Client::new(Config::new(primary.url()).acknowledged(1, Duration::from_millis(200)))
        .unwrap();
    signal(&replica, "-STOP");
    let tried = Lock::new("busy-acked")
        .client(acked.clone())
        .try_acquire()
        .await;
    let waited = Lock::new("busy-acked")
        .wait(Duration::from_millis(1500))
        .client(acked)
        .acquire()
        .await;
    signal(&replica, "-CONT");
    held.release().await.unwrap();
    assert!(
        matches!(tried, Err(LockError::Busy { .. })),
        "a try of a lock another holds: {tried:?}"
    );
    assert!(
        matches!(waited, Err(LockError::WaitTimeout { .. })),
        "a wait for a lock another holds throughout: {waited:?}"
    );
}

/// Acknowledged mode: each call waits at most the acknowledged timeout for
/// its `WAIT`, which blocks the connection it is sent on: concurrent
/// acquisitions with a replica not answering wait at the same time (the
/// primary has all 12 `WAIT`s blocked at once: each borrows a connection
/// of its own) and each fails as `NotReplicated`, not one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_acquisitions_do_not_wait_behind_each_others_wait() {
    let (primary, replica) = primary_with_replica();
    let timeout = Duration::from_secs(1);
    let client = Client::new(
        Config::new(primary.url())
            .response_timeout(Duration::from_secs(5))
            .acknowledged(1, timeout),
    )
    .unwrap();
    // The connection is open and the scripts known.
    confirmed(&Lock::new("warm").client(client.clone()))
        .await
        .release()
        .await
        .unwrap();
    signal(&replica, "-STOP");
    // The most `WAIT`s blocked at once on the primary, until they are done.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = tokio::task::spawn_blocking({
        let (done, port) = (std::sync::Arc::clone(&done), primary.port());
        move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let info = test_support::command(port, &["INFO", "clients"]).unwrap();
                let blocked: u64 = info
                    .lines()
                    .find_map(|line| line.strip_prefix("blocked_clients:"))
                    .and_then(|count| count.trim().parse().ok())
                    .unwrap_or(0);
                most = most.max(blocked);
                std::thread::sleep(Duration::from_millis(5));
            }
            most
        }
    });
    let started = Instant::now();
    let tries = (0..12).map(|i| {
        let lock = Lock::new(format!("hol:{i}")).client(client.clone());
        async move {
            let result = lock.try_acquire().await;
            (result, started.elapsed())
        }
    });
    let results = futures_util::future::join_all(tries).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most_blocked = watcher.await.unwrap();
    signal(&replica, "-CONT");
    let refused: Vec<String> = results
        .iter()
        .filter(|(result, _)| !matches!(result, Err(LockError::NotReplicated { .. })))
        .map(|(result, took)| format!("{took:?}: {result:?}"))
        .collect();
    assert!(
        refused.is_empty(),
        "acquisitions not refused as NotReplicated:\n{}",
        refused.join("\n")
    );
    assert_eq!(
        most_blocked, 12,
        "at most {most_blocked} of the 12 acquisitions' WAITs were blocked at once"
    );
    // One after the other they would take 12 s.
    let slowest = results.iter().map(|(_, took)| *took).max().unwrap();
    assert!(slowest < timeout * 6, "the last refusal took {slowest:?}");
}

/// A refusal comes within the acknowledged timeout plus one round trip (the
/// give-back), not at Redis's next tick after it (`WAIT`'s timeout is
/// checked every 100 ms: 200 ms asked took up to 300). A refused fenced
/// acquisition leaves no lock, and its fencing counter, which must keep
/// increasing whatever happens to the lock, stays (the guide's Configuration, design §12).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_comes_within_the_timeout_plus_one_round_trip() {
    let (primary, replica) = primary_with_replica();
    let timeout = Duration::from_millis(200);
    let client = acknowledged(&primary);
    // Warm: the scripts are cached, a connection of the pool is open, and
    // the replica confirms (its first confirmation may take a moment).
    let mut confirmed = false;
    for _ in 0..50 {
        if let Ok(guard) = Lock::new("timed")
            .fencing()
            .client(client.clone())
            .try_acquire()
            .await
        {
            guard.release().await.unwrap();
            confirmed = true;
            break;
        }
    }
    assert!(confirmed, "the replica confirms a write");
    signal(&replica, "-STOP");
    let mut took = Vec::new();
    for fencing in [false, true, false, true, false, true, false] {
        let lock = Lock::new("timed").client(client.clone());
        let lock = if fencing { lock.fencing() } else { lock };
        let started = Instant::now();
        let refused = lock.try_acquire().await;
        took.push(started.elapsed());
        assert!(
            matches!(refused, Err(LockError::NotReplicated { .. })),
            "{refused:?}"
        );
        assert_eq!(redis(&primary, &["EXISTS", "lock:{timed}"]), ":0\r\n");
        assert_eq!(redis(&primary, &["EXISTS", "lock:{timed}:fence"]), ":1\r\n");
    }
    signal(&replica, "-CONT");
    took.sort();
    eprintln!("refused after {took:?} (timeout {timeout:?})");
    // The typical refusal: the timeout and a loopback round trip, with room
    // for a loaded machine (left to Redis's tick it was about 300 ms).
    let median = took[took.len() / 2];
    assert!(median >= timeout, "{took:?}");
    assert!(median < timeout + Duration::from_millis(50), "{took:?}");
    // Confirmed again once the replica is back.
    Lock::new("timed")
        .client(client)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
