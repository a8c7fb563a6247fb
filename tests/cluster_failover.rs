//! What failovers, slot migrations and node faults do to held and
//! waited-on locks, on a real cluster: a manual `CLUSTER FAILOVER`, a
//! SIGKILLed primary (with a lock its replica never received), `redis-cli
//! --cluster reshard` of the slot of a held and waited-on lock, a primary
//! down while others renew, and the notifier's subscriptions through
//! killed connections, stalled nodes, migrations and refused subscriptions.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LockGuard};
use test_support::{RedisCluster, RedisServer};

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

/// Waits (bounded) until every lock of `guards` has had a renewal sent
/// after `since` confirmed by its holder; fails at once if one is lost.
async fn wait_for_renewals(what: &str, guards: &[(&str, &LockGuard)], since: Instant) {
    wait_until_async(what, LINE_TIMEOUT, || {
        for (name, guard) in guards {
            assert!(
                guard.is_held(),
                "{what}: `{name}` was lost {:?} after {:?}",
                since.elapsed(),
                guard.lost_cause()
            );
        }
        guards.iter().all(|(_, guard)| renewed_since(guard, since))
    })
    .await;
}

/// The one waiter queued in `queue` on the node on `port`: its channel
/// (where a release tells it) and its token (its entry is
/// `<channel>|<token>`).
fn queued_waiter(port: u16, queue: &str) -> (String, String) {
    let reply = test_support::command(port, &["LRANGE", queue, "0", "-1"]).unwrap();
    let entries = bulk_items(&reply);
    assert_eq!(entries.len(), 1, "one waiter in {queue}: {reply:?}");
    let (channel, token) = entries[0].rsplit_once('|').expect("<channel>|<token>");
    (channel.to_owned(), token.to_owned())
}

/// Subscribers of the shard channel `channel` on the node on `port`
/// (`PUBSUB SHARDNUMSUB`): a waiter's client listening there gets what a
/// release in the channel's slot publishes (on the slot's primary, or a
/// replica of it: a shard's messages reach its replicas' subscribers too).
fn shard_numsub(port: u16, channel: &str) -> u64 {
    let reply = test_support::command(port, &["PUBSUB", "SHARDNUMSUB", channel]).unwrap();
    let count = reply.rsplit(':').next().unwrap_or_default();
    count.trim().parse().unwrap_or_else(|_| panic!("{reply:?}"))
}

/// A manual failover (the replica catches up before taking over): every
/// lock is kept, renewals go on on the new primary (whose script cache is
/// empty: NOSCRIPT, then EVAL), and a waiter is still woken: its client
/// listens on its channel in the slot's shard when the release publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_keeps_every_lock_and_wakes_waiters() {
    let cluster = RedisCluster::start(3, 1);
    let (one, other) = (client(&cluster), client(&cluster));
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary).unwrap();
    let (on, off) = names_on(&cluster, primary, 10);
    // Renewed every 3 s: the failover (normally well under a second) has
    // the 6 s left of a lock's validity to be over.
    let ttl = Duration::from_secs(9);
    let mut guards = Vec::new();
    for name in on.iter().chain(&off) {
        guards.push((name.clone(), hold(&one, name, ttl).await));
    }
    let waiter = spawn_waiter(&other, &on[0], Duration::from_secs(60));
    let queue = format!("lock:{{{}}}:queue", on[0]);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    let (channel, _) = queued_waiter(primary, &queue);

    assert!(test_support::command(replica, &["CLUSTER", "FAILOVER"])
        .unwrap()
        .starts_with("+OK"));
    wait_until_async("the replica took over", LINE_TIMEOUT, || {
        cluster.primary_of_slot(slot(&queue)) == Some(replica)
    })
    .await;
    cluster.wait_until_ok().unwrap();
    let failed_over = Instant::now();
    // Every lock has a renewal sent after the failover confirmed: those of
    // the slots that moved, by the new primary.
    let held: Vec<(&str, &LockGuard)> = guards
        .iter()
        .map(|(name, guard)| (name.as_str(), guard))
        .collect();
    wait_for_renewals(
        "every lock is renewed after the failover",
        &held,
        failed_over,
    )
    .await;
    for (name, guard) in &guards {
        let held = get(&cluster, &format!("lock:{{{name}}}"));
        // The holder's token (then a wake mark if a waiter is queued).
        assert_eq!(
            held.as_deref().and_then(|held| held.split('|').next()),
            Some(guard.token()),
            "{name}"
        );
    }
    assert_eq!(one.renewal_stats().lost, 0);
    // The new primary's script cache started empty (scripts replicate as
    // their effects): its renewals (a script no waiter runs) got there by
    // NOSCRIPT, then EVAL.
    let noscript = info_field(replica, "errorstats", "errorstat_NOSCRIPT");
    assert!(
        noscript.is_some(),
        "the new primary never answered NOSCRIPT"
    );

    // The waiter's client listens on its channel in the slot's shard: on
    // the new primary, or still on the old one (a replica now, which gets
    // the shard's messages too) if it did not unsubscribe it.
    wait_until_async(
        "the waiter's client listens in the shard",
        LINE_TIMEOUT,
        || shard_numsub(replica, &channel) + shard_numsub(primary, &channel) >= 1,
    )
    .await;
    let mut guards = guards.into_iter();
    let (_, first) = guards.next().unwrap();
    first.release().await.unwrap();
    let taken = waited(waiter).await;
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
    // The failover (failure detection after the 2 s node timeout, the
    // election, the clients' new slot map: normally 3 to 4.5 s) must be
    // over while the locks are valid: at least 10 s after the kill (their
    // last renewal is at most a third of the ttl old).
    let ttl = Duration::from_secs(15);
    let mut kept = Vec::new();
    for name in on.iter().skip(1).chain(&off) {
        kept.push((name.clone(), hold(&one, name, ttl).await));
    }
    let waiter = spawn_waiter(&other, &on[1], Duration::from_secs(60));
    let queue = format!("lock:{{{}}}:queue", on[1]);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    let (channel, _) = queued_waiter(primary, &queue);
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
    let failed_over = Instant::now();
    assert_eq!(
        get(&cluster, &format!("lock:{{{lost_name}}}")),
        None,
        "the replica never had it"
    );
    wait_until_async("the subscription follows the slot", LINE_TIMEOUT, || {
        shard_numsub(replica, &channel) >= 1
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

    // The kept ones: held, each with a renewal sent after the failover
    // confirmed (by the new primary for those of the killed one's slots).
    let held: Vec<(&str, &LockGuard)> = kept
        .iter()
        .map(|(name, guard)| (name.as_str(), guard))
        .collect();
    wait_for_renewals(
        "the kept locks are renewed after the failover",
        &held,
        failed_over,
    )
    .await;
    for (name, guard) in &kept {
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
    let taken = waited(waiter).await;
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
/// the waiter there (its client listens on its channel on the target).
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
    // Renewed every 1.5 s: the reshard has the 3 s left of a lock's
    // validity to be over.
    let ttl = Duration::from_millis(4500);
    let guard = hold(&one, &name, ttl).await;
    // Another lock of the source, renewed in the same calls, stays there.
    let (staying, _) = names_on(&cluster, source, 2);
    let staying = staying
        .into_iter()
        .find(|other| slot(&format!("lock:{{{other}}}")) != first_slot)
        .unwrap();
    let stays = hold(&one, &staying, ttl).await;
    let waiter = spawn_waiter(&other, &name, Duration::from_secs(60));
    let queue = format!("lock:{{{name}}}:queue");
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(source, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    let (channel, _) = queued_waiter(source, &queue);
    wait_until_async("the waiter listens on the source", LINE_TIMEOUT, || {
        shard_numsub(source, &channel) == 1
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
    let resharded = Instant::now();
    // The waiter's client listens on the target now, not on the source.
    wait_until_async("the subscription follows the slot", LINE_TIMEOUT, || {
        shard_numsub(target, &channel) == 1 && shard_numsub(source, &channel) == 0
    })
    .await;
    // Renewals follow the slot: each lock has a renewal sent after the
    // reshard confirmed (the moved one by the target).
    wait_for_renewals(
        "both locks are renewed after the reshard",
        &[(name.as_str(), &guard), (staying.as_str(), &stays)],
        resharded,
    )
    .await;
    stays.release().await.unwrap();
    let held =
        value(&test_support::command(target, &["GET", &format!("lock:{{{name}}}")]).unwrap());
    // The holder's token, then the wake mark naming the waiter.
    assert_eq!(
        held.as_deref().and_then(|held| held.split('|').next()),
        Some(guard.token())
    );
    guard.release().await.unwrap();
    let taken = waited(waiter).await;
    taken.release().await.unwrap();
    assert_eq!(one.renewal_stats().lost, 0);
}

/// The notification connection to a primary is killed (`CLIENT KILL TYPE
/// pubsub`) while a waiter waits there: the subscription comes back, and
/// the release wakes the waiter (its client listens on its channel again
/// when the release publishes there).
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
    let waiter = spawn_waiter(&other, &on[0], Duration::from_secs(60));
    let queue = format!("lock:{{{}}}:queue", on[0]);
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    let (channel, _) = queued_waiter(primary, &queue);
    wait_until_async("the waiter listens", LINE_TIMEOUT, || {
        shard_numsub(primary, &channel) == 1
    })
    .await;
    let killed = test_support::command(primary, &["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    // The one subscribed connection was killed: a listener on the channel
    // from now on is a new connection. (Not checked as 0 listeners right
    // after the kill: under load the client can be back first, failing 1
    // whole-suite run in 2 beside busy loops.)
    assert_eq!(killed, ":1\r\n");
    // Back on the waiter's channel before the release publishes there.
    wait_until_async("the subscription comes back", LINE_TIMEOUT, || {
        shard_numsub(primary, &channel) == 1
    })
    .await;
    guard.release().await.unwrap();
    let taken = waited(waiter).await;
    taken.release().await.unwrap();
}

/// `CLUSTER KEYSLOT key`, asked of the node on `port`.
fn slot_on(port: u16, key: &str) -> u16 {
    let reply = test_support::command(port, &["CLUSTER", "KEYSLOT", key]).unwrap();
    value(&reply).unwrap().parse().unwrap()
}

/// A lock name whose keys are served by the primary on `port`.
fn name_on(cluster: &RedisCluster, port: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|name| cluster.primary_of_slot(slot(&format!("lock:{{{name}}}"))) == Some(port))
        .unwrap()
}

/// Calls of `command` the node on `port` has seen so far (failed ones
/// included: `INFO commandstats` counts `failed_calls` and
/// `rejected_calls` apart).
fn attempts_on(port: u16, command: &str) -> u64 {
    let stats = test_support::command(port, &["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
    else {
        return 0;
    };
    line.split(',')
        .filter_map(|field| field.split_once('='))
        .filter(|(name, _)| matches!(*name, "calls" | "rejected_calls" | "failed_calls"))
        .map(|(_, count)| count.trim().parse::<u64>().unwrap())
        .sum()
}

/// The bulk strings of a RESP array reply.
fn bulk_items(reply: &str) -> Vec<String> {
    reply
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .map(str::to_owned)
        .collect()
}

/// Moves `slot` (and its keys) from the primary on `from` to the one on
/// `to`, as `redis-cli --cluster reshard` does, without asking other nodes.
fn migrate_slot(slot: u16, from: u16, to: u16) {
    let slot = slot.to_string();
    let ok = |port: u16, args: &[&str]| {
        let reply = test_support::command(port, args).unwrap();
        assert!(reply.starts_with("+OK"), "{args:?}: {reply}");
    };
    ok(
        to,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &node_id(from)],
    );
    ok(
        from,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &node_id(to)],
    );
    let keys = test_support::command(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]).unwrap();
    for key in bulk_items(&keys) {
        let port = to.to_string();
        let reply =
            test_support::command(from, &["MIGRATE", "127.0.0.1", &port, &key, "0", "5000"])
                .unwrap();
        assert!(
            reply.starts_with("+OK") || reply.starts_with("+NOKEY"),
            "{reply}"
        );
    }
    ok(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &node_id(to)]);
    ok(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &node_id(to)]);
}

/// The client ids of the RESP3 connections (the notifier's: the lock
/// calls use RESP2) on the node on `port`.
fn resp3_clients(port: u16) -> Vec<String> {
    let list = test_support::command(port, &["CLIENT", "LIST"]).unwrap();
    list.lines()
        .filter(|line| line.contains(" resp=3"))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

/// One primary down: the locks on the healthy primaries keep being renewed
/// (each primary's part of a renewal batch is settled by its own reply),
/// and their holders keep them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_down_does_not_lose_the_locks_on_the_other_primaries() {
    let mut cluster = RedisCluster::start(3, 0);
    for &port in cluster.ports() {
        // The healthy primary keeps serving its slots while the other is down.
        test_support::command(
            port,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        )
        .unwrap();
    }
    let primaries = cluster.primaries();
    let (healthy, doomed) = (primaries[0], primaries[1]);
    let kept_name = name_on(&cluster, healthy, "kept");
    let doomed_name = name_on(&cluster, doomed, "doomed");
    let client = Client::new(
        Config::new(cluster_url(&cluster, ""))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(1000)),
    )
    .unwrap();
    let ttl = Duration::from_millis(3000);
    let lock = |name: &str| Lock::new(name).ttl(ttl).renew().client(client.clone());
    // Taken together: renewed in the same batches.
    let (kept_lock, doomed_lock) = (lock(&kept_name), lock(&doomed_name));
    let (kept, other) = tokio::join!(kept_lock.try_acquire(), doomed_lock.try_acquire());
    let (kept, dooms) = (kept.unwrap(), other.unwrap());
    let taken = Instant::now();
    wait_for_renewals(
        "both are renewed once, both fine",
        &[(kept_name.as_str(), &kept), (doomed_name.as_str(), &dooms)],
        taken,
    )
    .await;
    let before = client.renewal_stats();
    assert_eq!(before.lost, 0);

    cluster.kill(doomed);
    let killed = Instant::now();
    // Their next batch fails on the dead primary (and a lock retried after
    // a failure is retried with the others that failed with it): yet the
    // healthy primary's answer settles `kept`'s renewal, which its holder
    // confirms. Were the batch settled as a whole, `kept` would be retried
    // with `doomed` until it is lost, a ttl after the kill at the latest.
    wait_until_async("kept is renewed after the kill", LINE_TIMEOUT, || {
        let key = format!("lock:{{{kept_name}}}");
        assert!(
            kept.is_held(),
            "the holder of `{kept_name}` (on the healthy primary {healthy}) was told it lost \
             the lock {:?} after the other primary died, yet Redis still holds it for it: \
             GET {key} = {:?} (its token {}), PTTL {:?} ms; stats {:?}",
            killed.elapsed(),
            value(&test_support::command(healthy, &["GET", &key]).unwrap()),
            kept.token(),
            value(&test_support::command(healthy, &["PTTL", &key]).unwrap()),
            client.renewal_stats()
        );
        renewed_since(&kept, killed)
            && client.renewal_stats().failed_round_trips > before.failed_round_trips
    })
    .await;
}

/// A cluster client whose user may not run `SSUBSCRIBE` (an ACL with
/// `-ssubscribe`; the scripts' `SPUBLISH` is allowed): its waiters fall
/// back to timed retries, and once its last waiter is gone its notification
/// task stops asking (a refused subscription is retried only while the
/// slot has waiters, with a growing pause).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_not_retried_forever_without_waiters() {
    let cluster = RedisCluster::start(3, 0);
    for &port in cluster.ports() {
        let reply = test_support::command(
            port,
            &[
                "ACL",
                "SETUSER",
                "nochan",
                "on",
                ">secret",
                "~*",
                "&*",
                "+@all",
                "-ssubscribe",
            ],
        )
        .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let url = format!("redis-cluster://nochan:secret@{}", hosts.join(","));
    let (one, other) = (
        Client::new(Config::new(url.clone())).unwrap(),
        Client::new(Config::new(url)).unwrap(),
    );
    let port = cluster.primaries()[0];
    let name = name_on(&cluster, port, "nochan");
    let held = Lock::new(name.as_str())
        .ttl(Duration::from_secs(20))
        .client(one.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&other, &name, Duration::from_secs(20));
    let queue = format!("lock:{{{name}}}:queue");
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(port, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    held.release().await.unwrap();
    // Woken by its timed retry (no message can reach it).
    let guard = waited(waiter).await;
    guard.release().await.unwrap();
    // No waiter is left in `other`: nothing should be sent on its behalf.
    let total = |cluster: &RedisCluster| -> u64 {
        cluster
            .ports()
            .iter()
            .map(|&port| attempts_on(port, "ssubscribe"))
            .sum()
    };
    // A try the task decided on while the waiter waited has reached its
    // node by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = total(&cluster);
    // An observation window longer than the longest pause between tries
    // of a refused subscription (5 s): one that is retried forever is
    // tried in it at least once.
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = total(&cluster) - before;
    assert_eq!(
        during,
        0,
        "{during} SSUBSCRIBE attempts in {:?} by a client without a waiter",
        window.elapsed()
    );
    drop(other);
}

/// The server unsubscribes a slot (it migrated) while a resubscription of
/// several slots is in flight, one of them slow (its node stalls): the
/// slot counts as listened to only by the server's confirmation push, in
/// order with the `sunsubscribe`, not when the batch of calls ends; so it
/// is subscribed again, on its new node, for the waiter that waits there,
/// which is woken there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_unsubscribed_during_a_slow_resubscription_is_subscribed_again() {
    let cluster = RedisCluster::start(3, 0);
    for &port in cluster.ports() {
        test_support::command(
            port,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        )
        .unwrap();
    }
    let primaries = cluster.primaries();
    let (x, y, z) = (primaries[0], primaries[1], primaries[2]);
    let url = cluster_url(&cluster, "");
    let holder = Client::new(Config::new(url.clone())).unwrap();
    // A call to the stalled y ends by its timeout, 1 s after it was sent.
    let waiter = Client::new(
        Config::new(url)
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(700)),
    )
    .unwrap();
    let (on_x, on_y) = (name_on(&cluster, x, "sx"), name_on(&cluster, y, "sy"));
    // The waiter client waits on each (a slot is subscribed again only
    // while it has waiters): its notifier listens on both slots.
    let mut held = Vec::new();
    let mut waiting = Vec::new();
    let mut channels = Vec::new();
    for (name, port) in [(&on_x, x), (&on_y, y)] {
        held.push(
            Lock::new(name.as_str())
                .ttl(Duration::from_secs(60))
                .client(holder.clone())
                .try_acquire()
                .await
                .unwrap(),
        );
        waiting.push(spawn_waiter(&waiter, name, Duration::from_secs(60)));
        let queue = format!("lock:{{{name}}}:queue");
        wait_until_async("the waiter queues", LINE_TIMEOUT, || {
            test_support::command(port, &["LLEN", &queue]).unwrap() == ":1\r\n"
        })
        .await;
        let (channel, _) = queued_waiter(port, &queue);
        wait_until_async("the waiter listens", LINE_TIMEOUT, || {
            shard_numsub(port, &channel) == 1
        })
        .await;
        channels.push(channel);
    }
    let slot_x = slot_on(x, &format!("lock:{{{on_x}}}"));

    // y stalls; the notifier's connection to z (which serves neither slot)
    // drops: every slot is subscribed again, the one on y slowly.
    let before = resp3_clients(z);
    assert_eq!(
        before.len(),
        1,
        "the notifier's connection to z: {before:?}"
    );
    let x_subscriptions = attempts_on(x, "ssubscribe");
    let stopped = Stopped::stop(cluster.node(y).unwrap());
    test_support::command(z, &["CLIENT", "KILL", "ID", &before[0]]).unwrap();
    // x confirms at once: its confirmation goes out, on the notifier's
    // connection to x, before the `sunsubscribe` below.
    wait_until_async("x's slot is subscribed again", LINE_TIMEOUT, || {
        attempts_on(x, "ssubscribe") > x_subscriptions
    })
    .await;
    // x's slot moves to z while y's subscription still hangs: x sends the
    // notifier `sunsubscribe`. y stays stopped: the call there ends only
    // by its timeout, long after the `sunsubscribe` came in.
    migrate_slot(slot_x, x, z);

    // The waiter of x's slot, which waits on z now, has its channel
    // subscribed there (a slot lost is subscribed again while it has
    // waiters; one wrongly counted as listened to never would be).
    // Bounded by the longest pause between tries of a failed subscription
    // (5 s), many times over.
    let deadline = Instant::now() + LINE_TIMEOUT;
    while shard_numsub(z, &channels[0]) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let subscribed = shard_numsub(z, &channels[0]) == 1;
    drop(stopped);
    assert!(
        subscribed,
        "slot {slot_x} moved to z ({z}) and its channel was never subscribed there; \
         SHARDCHANNELS x: {:?}, y: {:?}, z: {:?}",
        shard_channels(x),
        shard_channels(y),
        shard_channels(z)
    );
    let mut waiting = waiting.into_iter();
    let mut held = held.into_iter();
    held.next().unwrap().release().await.unwrap();
    let guard = waited(waiting.next().unwrap()).await;
    guard.release().await.unwrap();
    // y's lock and its waiter are left to end with the test.
}

/// A `redis-cluster://` URL naming `ports` as seeds, in this order.
/// Takes the lock `name` at once and releases it (the client then knows
/// the slot map and has a connection to the name's primary).
async fn take_and_release(client: &Client, name: &str) {
    let guard = Lock::new(name)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
}

fn url_of(ports: &[u16]) -> String {
    let hosts: Vec<String> = ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{}", hosts.join(","))
}

/// A primary that stalls (SIGSTOP: a paused VM, a node behind a partition
/// that drops packets) instead of refusing connections: the locks on the
/// other, healthy primaries keep being renewed (design §12: "a primary that
/// is down or slow delays and fails only its own locks").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_primary_does_not_lose_the_locks_on_the_other_primaries() {
    let cluster = RedisCluster::start(3, 0);
    for &port in cluster.ports() {
        test_support::command(
            port,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        )
        .unwrap();
    }
    let primaries = cluster.primaries();
    let (healthy, stalled) = (primaries[0], primaries[1]);
    let kept_name = name_on(&cluster, healthy, "kept");
    let doomed_name = name_on(&cluster, stalled, "doomed");
    // Seeds: the stalled node first (any node may be the first seed).
    let mut seeds = vec![stalled];
    seeds.extend(cluster.ports().iter().filter(|&&port| port != stalled));
    let client = Client::new(
        Config::new(url_of(&seeds))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(1000)),
    )
    .unwrap();
    let ttl = Duration::from_millis(3000);
    let lock = |name: &str| Lock::new(name).ttl(ttl).renew().client(client.clone());
    let (kept_lock, doomed_lock) = (lock(&kept_name), lock(&doomed_name));
    let (kept, other) = tokio::join!(kept_lock.try_acquire(), doomed_lock.try_acquire());
    let (kept, dooms) = (kept.unwrap(), other.unwrap());
    let taken = Instant::now();
    wait_for_renewals(
        "both are renewed once, both fine",
        &[(kept_name.as_str(), &kept), (doomed_name.as_str(), &dooms)],
        taken,
    )
    .await;
    let before = client.renewal_stats();

    let stopped = Stopped::stop(cluster.node(stalled).unwrap());
    let since = Instant::now();
    // The stalled primary's part of their next batch times out; the
    // healthy one's answer settles `kept`'s renewal, which its holder
    // confirms. Were the batch settled as a whole, `kept` would be retried
    // with `doomed` (each retry timing out) until it is lost, a ttl after
    // the stall at the latest.
    let key = format!("lock:{{{kept_name}}}");
    let deadline = since + LINE_TIMEOUT;
    while kept.is_held()
        && !(renewed_since(&kept, since)
            && client.renewal_stats().failed_round_trips > before.failed_round_trips)
    {
        assert!(
            Instant::now() < deadline,
            "timed out: {:?}",
            client.renewal_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = kept.is_held();
    let elapsed = since.elapsed();
    let in_redis = value(&test_support::command(healthy, &["GET", &key]).unwrap());
    drop(stopped);
    assert!(
        held,
        "the holder of `{kept_name}` (on the healthy primary {healthy}) was told it lost the \
         lock {elapsed:?} after another primary stalled; GET {key} = {in_redis:?}; stats {:?}",
        client.renewal_stats()
    );
}

/// The same stall, with a replica that takes over: once the cluster has
/// failed the stalled primary (also the first seed) over, the client locks
/// names on every primary again, the promoted replica included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_stalled_primary_is_failed_over_locks_work_again() {
    let cluster = RedisCluster::start(3, 1);
    let primaries = cluster.primaries();
    let (healthy, stalled) = (primaries[0], primaries[1]);
    let replica = cluster.replica_of(stalled).unwrap();
    let healthy_name = name_on(&cluster, healthy, "healthy");
    let moved_name = name_on(&cluster, stalled, "moved");
    let mut seeds = vec![stalled];
    seeds.extend(cluster.ports().iter().filter(|&&port| port != stalled));
    let client = Client::new(
        Config::new(url_of(&seeds))
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    // The slot table is known, with a connection to every primary.
    for name in [&healthy_name, &moved_name] {
        take_and_release(&client, name).await;
    }

    let stopped = Stopped::stop(cluster.node(stalled).unwrap());
    // A call in the stalled primary's slots times out meanwhile.
    let during = Lock::new(moved_name.as_str())
        .client(client.clone())
        .try_acquire()
        .await;
    assert!(during.is_err(), "{during:?}");
    failed_over(&cluster, stalled, replica).await;

    let mut outcomes = Vec::new();
    for name in [&healthy_name, &moved_name] {
        let started = Instant::now();
        let taken = Lock::new(name.as_str())
            .client(client.clone())
            .try_acquire()
            .await;
        outcomes.push((
            name.clone(),
            taken.as_ref().map(|_| ()).map_err(|e| e.to_string()),
            started.elapsed(),
        ));
        if let Ok(guard) = taken {
            guard.release().await.unwrap();
        }
    }
    drop(stopped);
    assert!(
        outcomes.iter().all(|(_, taken, _)| taken.is_ok()),
        "after the failover (every other node maps the stalled primary {stalled}'s slots to \
         the replica {replica}), locking still fails: {outcomes:?}"
    );
}

/// A call already waiting on a stalled primary when its replica takes
/// over goes to the replica by itself: at half its deadline it fetches the
/// slot map again, and finding it changed sends the call by the new map.
/// Before, it waited on the stalled node until its deadline; and so did
/// every call routed by a map fetched while the failover was under way
/// (seen as a flake of the test above: a background release had fetched
/// the map a moment before the failover showed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_on_a_stalled_primary_goes_to_the_replica_that_took_over() {
    let cluster = RedisCluster::start(3, 1);
    let stalled = cluster.primaries()[1];
    let replica = cluster.replica_of(stalled).unwrap();
    let name = name_on(&cluster, stalled, "moved");
    // Half the deadline (12.5 s) is far longer than the failover takes
    // (cluster-node-timeout 2 s): the call is still waiting when the new
    // map shows.
    let response_timeout = Duration::from_secs(24);
    let client = Client::new(
        Config::new(url_of(cluster.ports()))
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(response_timeout),
    )
    .unwrap();
    // The slot map is known, with a connection to the primary.
    take_and_release(&client, &name).await;

    let stopped = Stopped::stop(cluster.node(stalled).unwrap());
    let call = tokio::spawn({
        let (client, name) = (client.clone(), name.clone());
        async move {
            let started = Instant::now();
            let taken = Lock::new(name.as_str()).client(client).try_acquire().await;
            (taken, started.elapsed())
        }
    });
    failed_over(&cluster, stalled, replica).await;
    let (taken, took) = call.await.unwrap();
    let on_replica =
        value(&test_support::command(replica, &["GET", &format!("lock:{{{name}}}")]).unwrap());
    drop(stopped);
    let guard = taken.unwrap_or_else(|error| {
        panic!("the call waiting on the stalled primary failed after {took:?}: {error}")
    });
    assert!(
        took < response_timeout,
        "it took {took:?}, not about half of its deadline"
    );
    assert!(on_replica.is_some(), "the lock is not on the replica");
    guard.release().await.unwrap();
}

/// Acknowledged mode on a cluster, a slot in migration (`IMPORTING` on the
/// target, `MIGRATING` on the source, as `redis-cli --cluster reshard` sets
/// it while it moves keys): a lock whose key is not on the source is
/// answered `ASK`; in acknowledged mode the call is a pipeline (the
/// command, then `WAIT`), which the router follows to the importing node
/// too (`ASKING` before each command): the acquisition succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_acquisition_in_a_migrating_slot_follows_ask() {
    let cluster = RedisCluster::start(3, 1);
    let primaries = cluster.primaries();
    let (from, to) = (primaries[0], primaries[1]);
    let name = name_on(&cluster, from, "migrating");
    let slot = slot(&format!("lock:{{{name}}}")).to_string();
    let ok = |port: u16, args: &[&str]| {
        let reply = test_support::command(port, args).unwrap();
        assert!(reply.starts_with("+OK"), "{args:?}: {reply}");
    };
    ok(
        to,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &node_id(from)],
    );
    ok(
        from,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &node_id(to)],
    );
    let url = url_of(cluster.ports());

    // Without the mode: ASK followed, the lock is taken (on the target).
    let plain = Client::new(Config::new(url.clone())).unwrap();
    take_and_release(&plain, &name).await;

    // The replica's acknowledgement comes in milliseconds; 2 s is for a
    // loaded machine.
    let acked = Client::new(
        Config::new(url)
            .response_timeout(Duration::from_millis(3000))
            .acknowledged(1, Duration::from_millis(2000)),
    )
    .unwrap();
    let started = Instant::now();
    let taken = Lock::new(name.as_str()).client(acked).try_acquire().await;
    assert!(
        taken.is_ok(),
        "acknowledged acquisition of `{name}` (slot {slot} migrating from {from} to {to}) failed \
         after {:?}: {taken:?}",
        started.elapsed()
    );
}

/// A Redis Cluster of one node (all 16384 slots on it, as many development
/// setups and single-shard deployments run): `CLUSTER SLOTS` names the node
/// with an empty host (it has never learnt its own address from a peer),
/// which means the host asked: locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_works() {
    let dir = std::env::temp_dir().join(format!(
        "review12b-single-{}-{}",
        std::process::id(),
        test_support::free_port().unwrap()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let port = test_support::free_port().unwrap();
    let extra = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--dir",
        &dir.display().to_string(),
    ]
    .map(str::to_owned);
    let node = RedisServer::start_with(port, &extra).unwrap();
    let reply = node
        .command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    wait_until("the cluster is ok", LINE_TIMEOUT, || {
        node.command(&["CLUSTER", "INFO"])
            .is_ok_and(|info| info.contains("cluster_state:ok"))
    });
    let slots = node.command(&["CLUSTER", "SLOTS"]).unwrap();
    let client =
        Client::new(Config::new(url_of(&[port])).response_timeout(Duration::from_secs(5))).unwrap();
    let taken = Lock::new("single").client(client).try_acquire().await;
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        taken.is_ok(),
        "a lock on a one-node cluster failed: {taken:?} (CLUSTER SLOTS: {slots:?})"
    );
}

/// `cluster-preferred-endpoint-type unknown-endpoint` (for clusters behind
/// one address, e.g. a load balancer or NAT): `CLUSTER SLOTS` answers a
/// null endpoint, meaning "the address you asked": locks work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_announcing_unknown_endpoints_works() {
    let cluster = RedisCluster::start(3, 0);
    for &port in cluster.ports() {
        let reply = test_support::command(
            port,
            &[
                "CONFIG",
                "SET",
                "cluster-preferred-endpoint-type",
                "unknown-endpoint",
            ],
        )
        .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let client =
        Client::new(Config::new(url_of(cluster.ports())).response_timeout(Duration::from_secs(5)))
            .unwrap();
    let taken = Lock::new("unknown-endpoint")
        .client(client)
        .try_acquire()
        .await;
    assert!(
        taken.is_ok(),
        "a lock on a cluster announcing unknown endpoints failed: {taken:?}"
    );
    assert!(!matches!(taken, Err(LockError::Busy { .. })));
}

/// The same for renewals: a renewed lock held in acknowledged mode whose
/// key was moved to the importing node while its slot is still in
/// migration (`redis-cli --cluster reshard` between its `MIGRATE` and its
/// final `SETSLOT ... NODE`): its renewals follow `ASK` and it keeps its
/// lock, as a plain client's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_renewal_in_a_migrating_slot_follows_ask() {
    let cluster = RedisCluster::start(3, 1);
    let primaries = cluster.primaries();
    let (from, to) = (primaries[0], primaries[1]);
    let plain_name = name_on(&cluster, from, "plain-moving");
    let acked_name = name_on(&cluster, from, "acked-moving");
    let url = url_of(cluster.ports());
    let plain = Client::new(Config::new(url.clone())).unwrap();
    let acked = Client::new(
        Config::new(url)
            .response_timeout(Duration::from_millis(3000))
            .acknowledged(1, Duration::from_millis(2000)),
    )
    .unwrap();
    let ttl = Duration::from_millis(3000);
    let plain_guard = Lock::new(plain_name.as_str())
        .ttl(ttl)
        .renew()
        .client(plain.clone())
        .try_acquire()
        .await
        .unwrap();
    let acked_guard = Lock::new(acked_name.as_str())
        .ttl(ttl)
        .renew()
        .client(acked.clone())
        .try_acquire()
        .await
        .unwrap();

    // Both slots in migration from `from` to `to`, their lock keys moved.
    for name in [&plain_name, &acked_name] {
        let key = format!("lock:{{{name}}}");
        let slot = slot(&key).to_string();
        let ok = |port: u16, args: &[&str]| {
            let reply = test_support::command(port, args).unwrap();
            assert!(reply.starts_with("+OK"), "{args:?}: {reply}");
        };
        ok(
            to,
            &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &node_id(from)],
        );
        ok(
            from,
            &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &node_id(to)],
        );
        let port = to.to_string();
        let reply =
            test_support::command(from, &["MIGRATE", "127.0.0.1", &port, &key, "0", "5000"])
                .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
    }
    let migrated = Instant::now();
    // Each holder has a renewal sent after the keys moved confirmed: the
    // key is only on the importing node, which the renewal reached by
    // `ASK` (and, for the acknowledged one, its `WAIT` too).
    let key = format!("lock:{{{acked_name}}}");
    let deadline = migrated + LINE_TIMEOUT;
    while !(renewed_since(&plain_guard, migrated) && renewed_since(&acked_guard, migrated)) {
        // (GET would be answered MOVED without ASKING: the slot is importing.)
        let on_target = || {
            test_support::command(
                to,
                &["CLUSTER", "GETKEYSINSLOT", &slot(&key).to_string(), "10"],
            )
            .unwrap()
        };
        assert!(
            plain_guard.is_held(),
            "the plain holder kept its lock through ASK"
        );
        assert!(
            acked_guard.is_held(),
            "the acknowledged holder of `{acked_name}` was told it lost its lock {:?} into the \
             migration, yet the importing node {to} holds its key: CLUSTER GETKEYSINSLOT = \
             {:?}; stats {:?}",
            migrated.elapsed(),
            on_target(),
            acked.renewal_stats()
        );
        assert!(
            Instant::now() < deadline,
            "no renewal confirmed since the migration: {:?}",
            acked.renewal_stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends SIGCONT to a stopped node when dropped (also when an assertion
/// fails), so the cluster can shut down.
/// Waits until the replica `replica` has taken over from the stalled
/// primary `stalled` (cluster-node-timeout 2 s), and every node but the
/// stalled one knows: its slot map gives the stalled primary's slots to the
/// replica (any of them may be the one the client asks for the slot map;
/// `cluster_state:ok` alone is also said by a node that has only flagged
/// the stalled primary as possibly failing, and still maps its slots to
/// it).
async fn failed_over(cluster: &RedisCluster, stalled: u16, replica: u16) {
    let replica_id = value(&test_support::command(replica, &["CLUSTER", "MYID"]).unwrap())
        .expect("the replica's node id");
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        let role = test_support::command(replica, &["ROLE"]).unwrap();
        let views: Vec<String> = cluster
            .ports()
            .iter()
            .filter(|&&port| port != stalled)
            .map(|&port| test_support::command(port, &["CLUSTER", "NODES"]).unwrap())
            .collect();
        let serves = |nodes: &String| {
            nodes.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.first() == Some(&replica_id.as_str())
                    && fields.get(2).is_some_and(|flags| flags.contains("master"))
                    && fields.len() > 8
            })
        };
        if role.contains("master") && views.iter().all(serves) {
            break;
        }
        assert!(Instant::now() < deadline, "no failover: {role} {views:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Stopped<'a>(&'a RedisServer);

impl<'a> Stopped<'a> {
    fn stop(server: &'a RedisServer) -> Stopped<'a> {
        signal(server, "-STOP");
        Stopped(server)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}
