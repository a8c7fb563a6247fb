//! What failovers and slot migrations do to held and waited-on locks, on a
//! real cluster: a manual `CLUSTER FAILOVER`, a SIGKILLed primary (with a
//! lock its replica never received), and `redis-cli --cluster reshard` of
//! the slot of a held and waited-on lock.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError, LockGuard};
use test_support::RedisCluster;

fn cluster_url(cluster: &RedisCluster, credentials: &str) -> String {
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{credentials}{}", hosts.join(","))
}

fn client(cluster: &RedisCluster) -> Client {
    Client::new(Config::new(cluster_url(cluster, ""))).unwrap()
}

/// The slot of `key` (CRC16 of its hash tag, as Redis Cluster computes it).
fn slot(key: &str) -> u16 {
    let tag = key
        .find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tag.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Lock names whose keys are served by the primary on `port`, and others.
fn names_on(cluster: &RedisCluster, port: u16, count: usize) -> (Vec<String>, Vec<String>) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for i in 0.. {
        let name = format!("f:{i}");
        if cluster.primary_of_slot(slot(&format!("lock:{{{name}}}"))) == Some(port) {
            if on.len() < count {
                on.push(name);
            }
        } else if off.len() < count {
            off.push(name);
        }
        if on.len() == count && off.len() == count {
            break;
        }
    }
    (on, off)
}

/// `GET key` on the primary that serves it now.
fn get(cluster: &RedisCluster, key: &str) -> Option<String> {
    let port = cluster.primary_of_slot(slot(key))?;
    value(&test_support::command(port, &["GET", key]).ok()?)
}

/// An `INFO` field's value on the node on `port`.
fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let info = test_support::command(port, &["INFO", section]).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(str::to_owned)
}

async fn hold(client: &Client, name: &str, ttl: Duration) -> LockGuard {
    Lock::new(name)
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
}

/// A manual failover (the replica catches up before taking over): every
/// lock is kept, renewals go on on the new primary (whose script cache is
/// empty: NOSCRIPT, then EVAL), and a waiter is still woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_keeps_every_lock_and_wakes_waiters() {
    let cluster = RedisCluster::start(3, 1);
    let (one, other) = (client(&cluster), client(&cluster));
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary).unwrap();
    let (on, off) = names_on(&cluster, primary, 10);
    let ttl = Duration::from_secs(3);
    let mut guards = Vec::new();
    for name in on.iter().chain(&off) {
        guards.push((name.clone(), hold(&one, name, ttl).await));
    }
    let waiter = tokio::spawn({
        let lock = Lock::new(on[0].as_str())
            .wait(Duration::from_secs(60))
            .client(other.clone());
        async move { lock.acquire().await }
    });
    let queue = format!("lock:{{{}}}:queue", on[0]);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;

    assert!(test_support::command(replica, &["CLUSTER", "FAILOVER"])
        .unwrap()
        .starts_with("+OK"));
    wait_until_async("the replica took over", LINE_TIMEOUT, || {
        cluster.primary_of_slot(slot(&queue)) == Some(replica)
    })
    .await;
    cluster.wait_until_ok().unwrap();
    // The waiter's client listens in the slot's shard: on the new primary,
    // or still on the old one (a replica now, which gets the shard's
    // messages too) if it did not unsubscribe it.
    wait_until_async("the subscription stays in the shard", LINE_TIMEOUT, || {
        shard_channels(replica).contains("lock-waiters:")
            || shard_channels(primary).contains("lock-waiters:")
    })
    .await;
    // Two renewal rounds on the new primary.
    tokio::time::sleep(ttl).await;
    for (name, guard) in &guards {
        assert!(guard.is_held(), "{name} lost in a manual failover");
        let held = get(&cluster, &format!("lock:{{{name}}}"));
        // The holder's token (then a wake mark if a waiter is queued).
        assert_eq!(
            held.as_deref().and_then(|held| held.split('|').next()),
            Some(guard.token()),
            "{name}"
        );
    }
    assert_eq!(one.renewal_stats().lost, 0);
    let noscript = info_field(replica, "errorstats", "errorstat_NOSCRIPT");
    assert!(
        noscript.is_some(),
        "renewals on the new primary met NOSCRIPT"
    );

    let mut guards = guards.into_iter();
    let (_, first) = guards.next().unwrap();
    first.release().await.unwrap();
    let taken = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    taken.release().await.unwrap();
    for (_, guard) in guards {
        guard.release().await.unwrap();
    }
}

/// A SIGKILLed primary whose replica never got one of its locks (the
/// replication link cut before it was taken): after the failover, the
/// holder of each replicated lock keeps it, the holder of the lost one is
/// told (its renewal finds the key gone), and a waiter of a kept lock still
/// gets it on its release. Never two silent holders: a contender can take
/// the lost lock, and its first holder knows it is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_keeps_replicated_locks_and_reports_the_lost_one() {
    let mut cluster = RedisCluster::start(3, 1);
    // The clients log in as `locker`; the replicas replicate as `default`.
    for &port in cluster.ports() {
        let reply = test_support::command(
            port,
            &[
                "ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*", "+@all",
            ],
        )
        .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let connect = || Client::new(Config::new(cluster_url(&cluster, "locker:secret@"))).unwrap();
    let (one, other) = (connect(), connect());
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary).unwrap();
    let (on, off) = names_on(&cluster, primary, 6);
    let ttl = Duration::from_secs(8);
    let mut kept = Vec::new();
    for name in on.iter().skip(1).chain(&off) {
        kept.push((name.clone(), hold(&one, name, ttl).await));
    }
    let waiter = tokio::spawn({
        let lock = Lock::new(on[1].as_str())
            .wait(Duration::from_secs(60))
            .client(other.clone());
        async move { lock.acquire().await }
    });
    let queue = format!("lock:{{{}}}:queue", on[1]);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    wait_until("the replica has every lock", LINE_TIMEOUT, || {
        info_field(primary, "replication", "master_repl_offset")
            == info_field(replica, "replication", "master_repl_offset")
    });

    // Cut replication: the replica's link is closed and it cannot log in again.
    let mut admin = redis::Client::open(format!("redis://locker:secret@127.0.0.1:{primary}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"])
        .query(&mut admin)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "replica"])
        .query(&mut admin)
        .unwrap();
    let lost_name = on[0].clone();
    let lost = hold(&one, &lost_name, ttl).await;
    cluster.kill(primary);
    wait_until_async("the replica took over", LINE_TIMEOUT, || {
        cluster.primary_of_slot(slot(&queue)) == Some(replica)
    })
    .await;
    cluster.wait_until_ok().unwrap();
    assert_eq!(
        get(&cluster, &format!("lock:{{{lost_name}}}")),
        None,
        "the replica never had it"
    );
    wait_until_async("the subscription follows the slot", LINE_TIMEOUT, || {
        shard_channels(replica).contains("lock-waiters:")
    })
    .await;

    // The lost lock: another holder can take it, and its first holder is
    // told by its next renewal.
    let contender = Lock::new(lost_name.as_str())
        .client(other.clone())
        .try_acquire()
        .await
        .unwrap();
    wait_until_async("the first holder is told", LINE_TIMEOUT, || !lost.is_held()).await;
    assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));
    contender.release().await.unwrap();

    // The kept ones: held, renewed on the new primary.
    tokio::time::sleep(Duration::from_secs(3)).await; // a renewal round there
    for (name, guard) in &kept {
        assert!(guard.is_held(), "{name}");
        let held = get(&cluster, &format!("lock:{{{name}}}"));
        // The holder's token (then a wake mark if a waiter is queued).
        assert_eq!(
            held.as_deref().and_then(|held| held.split('|').next()),
            Some(guard.token()),
            "{name}"
        );
    }
    let mut kept = kept.into_iter();
    let (_, first) = kept.next().unwrap();
    first.release().await.unwrap();
    let taken = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    taken.release().await.unwrap();
    for (_, guard) in kept {
        guard.release().await.unwrap();
    }
}

/// The node id of the node on `port`.
fn node_id(port: u16) -> String {
    value(&test_support::command(port, &["CLUSTER", "MYID"]).unwrap()).unwrap()
}

/// Shard channels the node on `port` has subscribers on.
fn shard_channels(port: u16) -> String {
    test_support::command(port, &["PUBSUB", "SHARDCHANNELS", "lock-waiters:*"]).unwrap()
}

/// `redis-cli --cluster reshard` moves the slot of a held and waited-on
/// lock to another primary: the holder keeps it (renewals follow the
/// slot), the waiter's subscription follows it too, and the release wakes
/// the waiter there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resharded_slot_keeps_its_lock_and_wakes_its_waiter() {
    let cluster = RedisCluster::start(3, 0);
    let (one, other) = (client(&cluster), client(&cluster));
    let primaries = cluster.primaries();
    let (source, target) = (primaries[0], primaries[1]);
    // A name in the first slot of the source: `reshard` moves slots from
    // the start of the source's ranges.
    let first_slot = (0..16384u16)
        .find(|&slot| cluster.primary_of_slot(slot) == Some(source))
        .unwrap();
    let name = (0..)
        .map(|i| format!("r:{i}"))
        .find(|name| slot(&format!("lock:{{{name}}}")) == first_slot)
        .unwrap();
    let ttl = Duration::from_millis(1500);
    let guard = hold(&one, &name, ttl).await;
    let waiter = tokio::spawn({
        let lock = Lock::new(name.as_str())
            .wait(Duration::from_secs(60))
            .client(other.clone());
        async move { lock.acquire().await }
    });
    let queue = format!("lock:{{{name}}}:queue");
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(source, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    wait_until_async("the waiter listens on the source", LINE_TIMEOUT, || {
        shard_channels(source).contains("lock-waiters:")
    })
    .await;

    cluster
        .cli(&[
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{source}"),
            "--cluster-from",
            &node_id(source),
            "--cluster-to",
            &node_id(target),
            "--cluster-slots",
            "1",
            "--cluster-yes",
        ])
        .unwrap();
    assert_eq!(cluster.primary_of_slot(first_slot), Some(target));
    cluster.wait_until_ok().unwrap();
    // The waiter's client listens on the target now, not on the source.
    wait_until_async("the subscription follows the slot", LINE_TIMEOUT, || {
        shard_channels(target).contains("lock-waiters:")
            && !shard_channels(source).contains("lock-waiters:")
    })
    .await;
    // Renewals follow the slot.
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held());
    let held =
        value(&test_support::command(target, &["GET", &format!("lock:{{{name}}}")]).unwrap());
    // The holder's token, then the wake mark naming the waiter.
    assert_eq!(
        held.as_deref().and_then(|held| held.split('|').next()),
        Some(guard.token())
    );
    guard.release().await.unwrap();
    let taken = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    taken.release().await.unwrap();
    assert_eq!(one.renewal_stats().lost, 0);
}

/// The notification connection to a primary is killed (`CLIENT KILL TYPE
/// pubsub`) while a waiter waits there: the subscription comes back, and
/// the release wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscription_comes_back() {
    let cluster = RedisCluster::start(3, 0);
    let (one, other) = (client(&cluster), client(&cluster));
    let primary = cluster.primaries()[0];
    let (on, _) = names_on(&cluster, primary, 1);
    let guard = Lock::new(on[0].as_str())
        .ttl(Duration::from_secs(30))
        .client(one.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = Lock::new(on[0].as_str())
            .wait(Duration::from_secs(60))
            .client(other.clone());
        async move { lock.acquire().await }
    });
    wait_until_async("the waiter listens", LINE_TIMEOUT, || {
        shard_channels(primary).contains("lock-waiters:")
    })
    .await;
    let killed = test_support::command(primary, &["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    assert_eq!(killed, ":1\r\n");
    wait_until_async("the subscription comes back", LINE_TIMEOUT, || {
        shard_channels(primary).contains("lock-waiters:")
    })
    .await;
    guard.release().await.unwrap();
    let taken = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    taken.release().await.unwrap();
}
