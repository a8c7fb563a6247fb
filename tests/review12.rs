//! Review 12: failing tests for the Redis Cluster pieces (sharded pub/sub,
//! renewals grouped per primary, acknowledged mode). Each test states the
//! guarantee it checks; each fails on the reviewed commit.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};
use test_support::RedisCluster;

fn cluster_url(cluster: &RedisCluster) -> String {
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{}", hosts.join(","))
}

/// `CLUSTER KEYSLOT key`, asked of the node on `port`.
fn keyslot(port: u16, key: &str) -> u16 {
    let reply = test_support::command(port, &["CLUSTER", "KEYSLOT", key]).unwrap();
    value(&reply).unwrap().parse().unwrap()
}

/// A lock name whose keys are served by the primary on `port`.
fn name_on(cluster: &RedisCluster, port: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|name| {
            cluster.primary_of_slot(keyslot(port, &format!("lock:{{{name}}}"))) == Some(port)
        })
        .unwrap()
}

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
        ],
    )
    .unwrap();
    wait_until("the replica is in sync", LINE_TIMEOUT, || {
        redis(&replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    (primary, replica)
}

/// Renewals are one pipeline per primary, but one renewal batch is one
/// result: when one primary is down, the locks on the healthy primaries
/// (whose pipeline went through and extended their keys) count as not
/// renewed too, and their holders are told they lost them, although Redis
/// keeps their keys (and every other client out) for another ttl.
///
/// At fault: `RedisBackend::renew` (`replies?` in the loop over the
/// groups' replies: the first failed group fails every item; and
/// `join_all` makes the batch last as long as the slowest group's retries).
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
        Config::new(cluster_url(&cluster))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let ttl = Duration::from_millis(2000);
    let lock = |name: &str| Lock::new(name).ttl(ttl).renew().client(client.clone());
    // Taken together: renewed in the same batches.
    let (kept_lock, doomed_lock) = (lock(&kept_name), lock(&doomed_name));
    let (kept, other) = tokio::join!(kept_lock.try_acquire(), doomed_lock.try_acquire());
    let (kept, _other) = (kept.unwrap(), other.unwrap());
    tokio::time::sleep(ttl).await; // renewed at least once, both fine
    assert!(kept.is_held());
    assert_eq!(client.renewal_stats().lost, 0);

    cluster.kill(doomed);
    // An observation window of two ttls: the healthy primary answers every
    // renewal of `kept` meanwhile.
    let killed = Instant::now();
    while killed.elapsed() < 2 * ttl && kept.is_held() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = format!("lock:{{{kept_name}}}");
    let in_redis = value(&test_support::command(healthy, &["GET", &key]).unwrap());
    let pttl = value(&test_support::command(healthy, &["PTTL", &key]).unwrap()).unwrap();
    assert!(
        kept.is_held(),
        "the holder of `{kept_name}` (on the healthy primary {healthy}) was told it lost the \
         lock {:?} after the other primary died, yet Redis still holds it for it: \
         GET {key} = {in_redis:?} (its token {}), PTTL {pttl} ms; stats {:?}",
        killed.elapsed(),
        kept.token(),
        client.renewal_stats()
    );
}

/// Acknowledged mode: `NotReplicated` means "the primary took the lock,
/// fewer replicas confirmed it, it was given back". A busy lock (nothing
/// written) with a lagging replica is reported as exactly that, not as
/// `Busy`: the `WAIT` after a `SET NX` that set nothing is checked like
/// the one after a write. A waiting acquire gives up at once the same way.
///
/// At fault: `Link::Acked` in connection.rs checks the `WAIT` reply
/// whatever the write's outcome (`check_ack` after a `Nil` / busy reply);
/// `RedisBackend::acquire` turns it into `NotReplicated`.
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

/// Acknowledged mode: each call is documented to wait at most the
/// acknowledged timeout for its `WAIT`. But `WAIT` blocks the server-side
/// client, and every call of a client shares one multiplexed connection:
/// with a replica not answering, concurrent acquisitions' `WAIT`s run one
/// after the other, so the n-th waits n timeouts; past the call deadline
/// they fail as Redis timeouts (outcome unknown, connection replaced)
/// instead of `NotReplicated`, and every other call of the client (releases,
/// renewals of other locks) queues behind them.
///
/// At fault: `Link::Acked` sends `WAIT` on the shared `ConnectionManager`
/// (connection.rs), `RedisBackend::call` in acknowledged mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_acquisitions_do_not_wait_behind_each_others_wait() {
    let (primary, replica) = primary_with_replica();
    let timeout = Duration::from_millis(200);
    let client = Client::new(Config::new(primary.url()).acknowledged(1, timeout)).unwrap();
    // The connection is open and the scripts known.
    Lock::new("warm")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    signal(&replica, "-STOP");
    let started = Instant::now();
    let tries = (0..12).map(|i| {
        let lock = Lock::new(format!("hol:{i}")).client(client.clone());
        async move {
            let result = lock.try_acquire().await;
            (result, started.elapsed())
        }
    });
    let results = futures_util::future::join_all(tries).await;
    signal(&replica, "-CONT");
    let slow: Vec<String> = results
        .iter()
        .filter(|(result, took)| {
            !matches!(result, Err(LockError::NotReplicated { .. })) || *took > timeout * 3
        })
        .map(|(result, took)| format!("{took:?}: {result:?}"))
        .collect();
    assert!(
        slow.is_empty(),
        "acquisitions refused later than 3 x the {timeout:?} acknowledged timeout, or not \
         as NotReplicated:\n{}",
        slow.join("\n")
    );
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

/// A cluster client whose user may not run `SSUBSCRIBE` (an ACL with
/// `-ssubscribe`; the scripts' `SPUBLISH` is allowed): its waiters fall back to timed retries, as documented, but its
/// notification task retries `SSUBSCRIBE` for every slot a waiter ever
/// waited in, every 200 ms, for as long as the client lives, long after
/// its last waiter is gone (the one-server task ends when it cannot
/// subscribe and no waiter is left).
///
/// At fault: `notify/cluster.rs` `run` / `subscribe_slots` (a failed
/// subscription re-kicks the loop forever; `wanted` is never emptied and
/// `end_task_if_idle` is only asked when the connection cannot be opened).
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
    let waiter = tokio::spawn({
        let lock = Lock::new(name.as_str())
            .wait(Duration::from_secs(20))
            .client(other.clone());
        async move { lock.acquire().await }
    });
    let queue = format!("lock:{{{name}}}:queue");
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(port, &["LLEN", &queue]).unwrap() == ":1\r\n"
    })
    .await;
    held.release().await.unwrap();
    // Woken by its timed retry (no message can reach it).
    let guard = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    // No waiter is left in `other`: nothing should be sent on its behalf.
    let total = |cluster: &RedisCluster| -> u64 {
        cluster
            .ports()
            .iter()
            .map(|&port| attempts_on(port, "ssubscribe"))
            .sum()
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // the last retry settles
    let before = total(&cluster);
    tokio::time::sleep(Duration::from_secs(2)).await; // an observation window
    let during = total(&cluster) - before;
    assert!(
        during <= 1,
        "{during} SSUBSCRIBE attempts in 2 s by a client without a waiter"
    );
    drop(other);
}

/// The bulk strings of a RESP array reply.
fn bulk_items(reply: &str) -> Vec<String> {
    reply
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .map(str::to_owned)
        .collect()
}

fn node_id(port: u16) -> String {
    value(&test_support::command(port, &["CLUSTER", "MYID"]).unwrap()).unwrap()
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

fn shard_channels(port: u16) -> String {
    test_support::command(port, &["PUBSUB", "SHARDCHANNELS", "lock-waiters:*"]).unwrap()
}

/// The server unsubscribes a slot (it migrated) while a resubscription of
/// several slots is in flight, one of them slow (its node stalls): the
/// slot's confirmation, received before the `sunsubscribe`, is applied
/// after it, when the whole batch ends. The slot then counts as listened
/// to, so it is never subscribed again on its new node: every later waiter
/// there is served only by its timed retries, and releases there wake
/// nobody.
///
/// At fault: `notify/cluster.rs` `subscribe_slots` (`set_ready` for each
/// slot after `join_all`, whatever `handle` did with a `SUnsubscribe`
/// push for that slot meanwhile).
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
    let url = cluster_url(&cluster);
    let holder = Client::new(Config::new(url.clone())).unwrap();
    let waiter = Client::new(
        Config::new(url)
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(700)),
    )
    .unwrap();
    let (on_x, on_y) = (name_on(&cluster, x, "sx"), name_on(&cluster, y, "sy"));
    // The waiter client waits once on each: its notifier listens on both slots.
    for (name, port) in [(&on_x, x), (&on_y, y)] {
        let held = Lock::new(name.as_str())
            .ttl(Duration::from_secs(20))
            .client(holder.clone())
            .try_acquire()
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let lock = Lock::new(name.as_str())
                .wait(Duration::from_secs(20))
                .client(waiter.clone());
            async move { lock.acquire().await }
        });
        wait_until_async("the waiter listens", LINE_TIMEOUT, || {
            shard_channels(port).contains("lock-waiters:")
        })
        .await;
        held.release().await.unwrap();
        let guard = tokio::time::timeout(LINE_TIMEOUT, waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
    let slot_x = keyslot(x, &format!("lock:{{{on_x}}}"));

    // y stalls; the notifier's connection to z (which serves neither slot)
    // drops: every slot is subscribed again, the one on y slowly.
    let before = resp3_clients(z);
    assert_eq!(
        before.len(),
        1,
        "the notifier's connection to z: {before:?}"
    );
    signal(cluster.node(y).unwrap(), "-STOP");
    test_support::command(z, &["CLIENT", "KILL", "ID", &before[0]]).unwrap();
    wait_until_async("the notifier reconnects to z", LINE_TIMEOUT, || {
        resp3_clients(z).iter().any(|id| *id != before[0])
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await; // x confirms at once
                                                          // x's slot moves to z while y's subscription still hangs: x sends the
                                                          // notifier `sunsubscribe`.
    migrate_slot(slot_x, x, z);
    tokio::time::sleep(Duration::from_millis(1000)).await; // y's call times out
    signal(cluster.node(y).unwrap(), "-CONT");

    // The next waiter of x's slot: its subscription goes to z (a slot
    // lost is subscribed again when it has waiters; one wrongly counted as
    // listened to never would be).
    let held = Lock::new(on_x.as_str())
        .ttl(Duration::from_secs(20))
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let lock = Lock::new(on_x.as_str())
            .wait(Duration::from_secs(20))
            .client(waiter.clone());
        async move { lock.acquire().await }
    });
    let deadline = Instant::now() + Duration::from_secs(8);
    while !shard_channels(z).contains("lock-waiters:") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        shard_channels(z).contains("lock-waiters:"),
        "slot {slot_x} moved to z ({z}) and its channel was never subscribed there; \
         SHARDCHANNELS x: {:?}, y: {:?}, z: {:?}",
        shard_channels(x),
        shard_channels(y),
        shard_channels(z)
    );
    held.release().await.unwrap();
    let guard = tokio::time::timeout(LINE_TIMEOUT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
}
