//! The lock on a real Redis Cluster (3 primaries, 3 replicas, started by
//! test-support with `redis-cli --cluster create`): every primitive on keys
//! spread over the slots, mutual exclusion across OS processes, and names
//! with braces keeping every key of a lock in one slot.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LockGuard, RwLock, Semaphore};
use test_support::RedisCluster;

fn cluster_url(cluster: &RedisCluster) -> String {
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{}", hosts.join(","))
}

fn client(cluster: &RedisCluster) -> Client {
    Client::new(Config::new(cluster_url(cluster))).unwrap()
}

/// `CLUSTER KEYSLOT key`, asked of any node.
fn keyslot(cluster: &RedisCluster, key: &str) -> u16 {
    let reply = test_support::command(cluster.ports()[0], &["CLUSTER", "KEYSLOT", key]).unwrap();
    value(&reply).unwrap().parse().unwrap()
}

/// Names whose locks land on every primary.
fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("spread:{i}")).collect()
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
fn renewed_since(guard: &LockGuard, since: Instant) -> bool {
    let ttl = guard.ttl();
    guard.is_held() && Instant::now() + guard.remaining() >= since + ttl - drift_margin(ttl)
}

/// Waits (bounded) until every one of `guards` has had a renewal sent after
/// `since` confirmed by its holder; fails at once if one is lost.
async fn wait_for_renewals(what: &str, guards: &[LockGuard], since: Instant) {
    wait_until_async(what, LINE_TIMEOUT, || {
        for guard in guards {
            assert!(
                guard.is_held(),
                "{what}: `{}` was lost {:?} after {:?}",
                guard.name(),
                since.elapsed(),
                guard.lost_cause()
            );
        }
        guards.iter().all(|guard| renewed_since(guard, since))
    })
    .await;
}

/// The one waiter queued in `queue` on the node on `port`: its channel,
/// where a release tells it (its entry is `<channel>|<token>`).
fn queued_channel(port: u16, queue: &str) -> String {
    let reply = test_support::command(port, &["LRANGE", queue, "0", "-1"]).unwrap();
    let entries: Vec<&str> = reply
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .collect();
    assert_eq!(entries.len(), 1, "one waiter in {queue}: {reply:?}");
    let (channel, _token) = entries[0].rsplit_once('|').expect("<channel>|<token>");
    channel.to_owned()
}

/// Subscribers of the shard channel `channel` on the node on `port`
/// (`PUBSUB SHARDNUMSUB`).
fn shard_numsub(port: u16, channel: &str) -> u64 {
    let reply = test_support::command(port, &["PUBSUB", "SHARDNUMSUB", channel]).unwrap();
    let count = reply.rsplit(':').next().unwrap_or_default();
    count.trim().parse().unwrap_or_else(|_| panic!("{reply:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_works_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let (one, other) = (client(&cluster), client(&cluster));
    let names = names(30);
    let primaries: std::collections::BTreeSet<u16> = names
        .iter()
        .filter_map(|name| cluster.primary_of_slot(keyslot(&cluster, &format!("lock:{{{name}}}"))))
        .collect();
    assert_eq!(primaries.len(), 3, "the names cover every primary");

    // Try, busy, release; fencing tokens increase.
    let mut last_fence = 0;
    for name in &names {
        let lock = Lock::new(name.as_str()).fencing().client(one.clone());
        let guard = lock.try_acquire().await.unwrap();
        let fence = guard.fencing_token().unwrap();
        assert!(fence > 0);
        let busy = Lock::new(name.as_str())
            .client(other.clone())
            .try_acquire()
            .await;
        assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
        guard.release().await.unwrap();
        let again = lock.try_acquire().await.unwrap();
        assert!(again.fencing_token().unwrap() > fence);
        last_fence = last_fence.max(fence);
        again.release().await.unwrap();
    }

    // A waiter of another client gets the lock when it is released.
    for name in names.iter().take(6) {
        let held = Lock::new(name.as_str())
            .ttl(Duration::from_secs(30))
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        let waiter = spawn_waiter(&other, name, Duration::from_secs(20));
        let queue = format!("lock:{{{name}}}:queue");
        wait_until_async("the waiter queues", LINE_TIMEOUT, || {
            let port = cluster.primary_of_slot(keyslot(&cluster, &queue)).unwrap();
            test_support::command(port, &["LLEN", &queue]).unwrap() == ":1\r\n"
        })
        .await;
        held.release().await.unwrap();
        let guard = waited(waiter).await;
        guard.release().await.unwrap();
    }

    // Renewal keeps locks on every primary past their ttl: each has a
    // renewal sent after they were all taken confirmed.
    let mut guards = Vec::new();
    for name in &names {
        let guard = Lock::new(name.as_str())
            .ttl(Duration::from_secs(3))
            .renew()
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    let taken = Instant::now();
    wait_for_renewals("every lock is renewed", &guards, taken).await;
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(one.renewal_stats().lost, 0);

    // Read/write locks and semaphores.
    for name in names.iter().take(6) {
        let rw = RwLock::new(name.as_str()).client(one.clone());
        let (a, b) = (
            rw.read().try_acquire().await.unwrap(),
            rw.read().try_acquire().await.unwrap(),
        );
        let write = RwLock::new(name.as_str())
            .client(other.clone())
            .write()
            .try_acquire()
            .await;
        assert!(matches!(write, Err(LockError::Busy { .. })), "{write:?}");
        a.release().await.unwrap();
        b.release().await.unwrap();
        let write = RwLock::new(name.as_str())
            .client(other.clone())
            .write()
            .try_acquire()
            .await
            .unwrap();
        assert!(matches!(
            rw.read().try_acquire().await,
            Err(LockError::Busy { .. })
        ));
        write.release().await.unwrap();

        let semaphore = Semaphore::new(name.as_str(), 2).client(one.clone());
        let permits = [
            semaphore.try_acquire().await.unwrap(),
            semaphore.try_acquire().await.unwrap(),
        ];
        assert!(matches!(
            semaphore.try_acquire().await,
            Err(LockError::Busy { .. })
        ));
        for permit in permits {
            permit.release().await.unwrap();
        }
    }
}

/// Calls of `command` the node on `port` has run so far (scripts'
/// included), those that failed (a script's `NOSCRIPT`) left out.
fn calls_on(port: u16, command: &str) -> u64 {
    let stats = test_support::command(port, &["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
    else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .filter_map(|field| field.split_once('='))
            .find(|(field, _)| *field == name)
            .map_or(0, |(_, count)| count.trim().parse().unwrap())
    };
    field("calls") - field("failed_calls")
}

/// Releases wake waiters of another client on every primary by one
/// message on the lock's own shard (SPUBLISH; the waiter's client listens
/// on its channel there when the release publishes): no classic PUBLISH
/// (which a cluster broadcasts to every node), and no polling while they
/// wait (no attempt more often than a waiter refreshes its place in the
/// queue, every 500 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_sharded_messages() {
    let cluster = RedisCluster::start(3, 0);
    let (one, other) = (client(&cluster), client(&cluster));
    let names: Vec<String> = names(12);
    let mut woken_on = std::collections::BTreeSet::new();
    for name in &names {
        let slot = keyslot(&cluster, &format!("lock:{{{name}}}"));
        let port = cluster.primary_of_slot(slot).unwrap();
        let held = Lock::new(name.as_str())
            .ttl(Duration::from_secs(30))
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        let waiter = spawn_waiter(&other, name, Duration::from_secs(20));
        let queue = format!("lock:{{{name}}}:queue");
        wait_until_async("the waiter queues", LINE_TIMEOUT, || {
            test_support::command(port, &["LLEN", &queue]).unwrap() == ":1\r\n"
        })
        .await;
        // From here on it makes one attempt right after subscribing, then
        // one each time it refreshes its place (every 500 ms, or later on
        // a loaded machine): at most 2 + window / 500 ms in a window. A
        // waiter polling every 100 ms would make 3 in 300 ms.
        let window = Instant::now();
        let calls_before = calls_on(port, "evalsha") + calls_on(port, "eval");
        tokio::time::sleep(Duration::from_millis(300)).await; // an observation window
        let calls = calls_on(port, "evalsha") + calls_on(port, "eval") - calls_before;
        let window = window.elapsed();
        let most = 2 + (window.as_millis() / 500) as u64;
        assert!(
            calls <= most,
            "{name}: {calls} attempts in {window:?} while the lock was held"
        );
        // Its client listens on its channel on the slot's primary, where
        // the release publishes.
        let channel = queued_channel(port, &queue);
        wait_until_async("the waiter's client listens", LINE_TIMEOUT, || {
            shard_numsub(port, &channel) == 1
        })
        .await;
        held.release().await.unwrap();
        let guard = waited(waiter).await;
        guard.release().await.unwrap();
        woken_on.insert(port);
    }
    assert_eq!(woken_on.len(), 3, "the names cover every primary");
    for port in cluster.ports().iter().copied() {
        assert_eq!(calls_on(port, "publish"), 0, "a classic PUBLISH on {port}");
    }
    let sharded: u64 = cluster
        .ports()
        .iter()
        .map(|&port| calls_on(port, "spublish"))
        .sum();
    assert!(sharded >= names.len() as u64, "{sharded} SPUBLISH calls");
}

/// Renewals go as one pipeline per primary per batch, however many slots
/// the locks are in, and each script call renews up to 100 locks of its
/// primary, whatever their slots (`allow-cross-slot-keys`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_take_one_round_trip_per_primary() {
    let cluster = RedisCluster::start(3, 0);
    let one = client(&cluster);
    let names = names(300);
    let mut guards = Vec::new();
    for name in &names {
        let guard = Lock::new(name.as_str())
            .ttl(Duration::from_secs(3))
            .renew()
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    // Read shares and permits too, on other names.
    let mut shares = Vec::new();
    for name in names.iter().take(20) {
        let reader = RwLock::new(format!("{name}:rw"))
            .ttl(Duration::from_secs(3))
            .renew()
            .client(one.clone());
        shares.push(reader.read().try_acquire().await.unwrap());
        let semaphore = Semaphore::new(format!("{name}:sem"), 2)
            .ttl(Duration::from_secs(3))
            .renew()
            .client(one.clone());
        shares.push(semaphore.try_acquire().await.unwrap());
    }
    let scripts = |cluster: &RedisCluster| -> u64 {
        cluster
            .ports()
            .iter()
            .map(|&port| calls_on(port, "evalsha") + calls_on(port, "eval"))
            .sum()
    };
    let (before, scripts_before) = (one.renewal_stats(), scripts(&cluster));
    // Two renewals of each: one sent after they were all taken, and one
    // sent after that one was confirmed for all.
    let taken = Instant::now();
    wait_for_renewals("every hold is renewed", &guards, taken).await;
    wait_for_renewals("every share is renewed", &shares, taken).await;
    let once = Instant::now();
    wait_for_renewals("every hold is renewed again", &guards, once).await;
    wait_for_renewals("every share is renewed again", &shares, once).await;
    let (after, script_calls) = (one.renewal_stats(), scripts(&cluster) - scripts_before);
    let (batches, round_trips) = (
        after.batches - before.batches,
        after.round_trips - before.round_trips,
    );
    assert!(batches >= 2, "{batches} renewal batches");
    assert!(
        round_trips <= 3 * batches,
        "{round_trips} round trips for {batches} batches of locks on 3 primaries"
    );
    // 340 holds on 3 primaries: a call renews up to 100 locks, or 100
    // shares, of one primary whatever their slots (at most 3 calls per
    // primary a batch; one per slot would be ~340). The client's holder
    // record comes on top: at most one write per 200 ms (2 s: 10, and 2
    // for a write in flight at each end).
    assert!(
        script_calls <= 9 * batches + 12,
        "{script_calls} script calls for {batches} renewal batches"
    );
    assert_eq!(after.lost, 0);
    for guard in guards {
        assert!(guard.is_held());
        guard.release().await.unwrap();
    }
    for share in shares {
        assert!(share.is_held());
        share.release().await.unwrap();
    }
}

/// A name with braces still puts every key of its lock in one slot: the
/// hash tag is the text up to the first `}`, the same for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_braces_keep_a_lock_in_one_slot() {
    let cluster = RedisCluster::start(3, 0);
    let (one, other) = (client(&cluster), client(&cluster));
    for name in ["a}b{c", "x{y}z", "{tag}", "q{", "p}}"] {
        let held = Lock::new(name)
            .fencing()
            .ttl(Duration::from_secs(30))
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        // A waiter builds the queue keys too; its acquire script touches all
        // of them at once (a CROSSSLOT error would fail it).
        let waiter = Lock::new(name)
            .wait(Duration::from_millis(300))
            .client(other.clone())
            .acquire()
            .await;
        assert!(
            matches!(waiter, Err(LockError::WaitTimeout { .. })),
            "{name}: {waiter:?}"
        );
        let key = format!("lock:{{{name}}}");
        let slot = keyslot(&cluster, &key);
        for suffix in [":fence", ":queue", ":waiters", ":rw", ":rw:readers", ":sem"] {
            assert_eq!(
                keyslot(&cluster, &format!("{key}{suffix}")),
                slot,
                "{name}{suffix}"
            );
        }
        held.release().await.unwrap();
    }
}

/// Mutual exclusion across OS processes on a cluster: 4 processes x 4
/// tasks on one key, a non-atomic counter (on a plain server beside it).
#[test]
fn no_update_is_lost_across_processes_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let counter_server = RedisServer::start();
    let url = cluster_url(&cluster);
    let bookkeeping = counter_server.url();
    let mut workers: Vec<Process> = (0..4)
        .map(|_| {
            Process::spawn_with_env(
                env!("CARGO_BIN_EXE_lock-worker"),
                &["count", "cluster-counter", "4", "10", "counter"],
                Some(&url),
                &[("BOOKKEEPING_URL", &bookkeeping)],
            )
        })
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT * 4), "done");
    }
    let total: i64 = value(&redis(&counter_server, &["GET", "counter"]))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, 4 * 4 * 10);
}

/// Mutual exclusion across OS processes on keys spread over every primary:
/// 3 processes x 12 keys x 2 tasks, a non-atomic counter per key.
#[test]
fn no_update_is_lost_on_keys_spread_over_the_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let counter_server = RedisServer::start();
    let url = cluster_url(&cluster);
    let bookkeeping = counter_server.url();
    let keys = 12;
    let primaries: std::collections::BTreeSet<u16> = (0..keys)
        .filter_map(|k| cluster.primary_of_slot(keyslot(&cluster, &format!("lock:{{spread:{k}}}"))))
        .collect();
    assert_eq!(primaries.len(), 3, "the keys cover every primary");
    let mut workers: Vec<Process> = (0..3)
        .map(|_| {
            Process::spawn_with_env(
                env!("CARGO_BIN_EXE_lock-worker"),
                &["count-spread", "spread", &keys.to_string(), "2", "5"],
                Some(&url),
                &[("BOOKKEEPING_URL", &bookkeeping)],
            )
        })
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT * 4), "done");
    }
    for k in 0..keys {
        let total: i64 = value(&redis(
            &counter_server,
            &["GET", &format!("counter:spread:{k}")],
        ))
        .unwrap()
        .parse()
        .unwrap();
        assert_eq!(total, 3 * 2 * 5, "spread:{k}");
    }
}
