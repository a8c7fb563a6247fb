//! The lock on a real Redis Cluster (3 primaries, 3 replicas, started by
//! test-support with `redis-cli --cluster create`): every primitive on keys
//! spread over the slots, mutual exclusion across OS processes, and names
//! with braces keeping every key of a lock in one slot.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError, RwLock, Semaphore};
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

    // Renewal keeps locks on every primary past their ttl.
    let mut guards = Vec::new();
    for name in &names {
        let guard = Lock::new(name.as_str())
            .ttl(Duration::from_millis(600))
            .renew()
            .client(one.clone())
            .try_acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for guard in guards {
        assert!(guard.is_held());
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

/// Calls of `command` the node on `port` has run so far (scripts' included).
fn calls_on(port: u16, command: &str) -> u64 {
    let stats = test_support::command(port, &["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Releases wake waiters of another client on every primary by one
/// message on the lock's own shard (SPUBLISH): no classic PUBLISH (which
/// a cluster broadcasts to every node), and no polling while they wait.
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
        // Its client listens on the slot's channel before its second attempt.
        let calls_before = calls_on(port, "evalsha") + calls_on(port, "eval");
        tokio::time::sleep(Duration::from_millis(300)).await; // an observation window
        let calls = calls_on(port, "evalsha") + calls_on(port, "eval") - calls_before;
        assert!(
            calls <= 2,
            "{name}: {calls} attempts while the lock was held"
        );
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
            .ttl(Duration::from_millis(900))
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
            .ttl(Duration::from_millis(900))
            .renew()
            .client(one.clone());
        shares.push(reader.read().try_acquire().await.unwrap());
        let semaphore = Semaphore::new(format!("{name}:sem"), 2)
            .ttl(Duration::from_millis(900))
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
    tokio::time::sleep(Duration::from_millis(2000)).await; // several renewals of each
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
