//! lockctl on a local Redis Cluster of 3 primaries (`list` scans every
//! primary; a forced release there wakes the waiter by its shard's message)
//! and over a quorum of 3 independent nodes (one row per lock, the holder
//! counted per node; a forced release counts a majority).

mod common;
use common::*;

use std::collections::BTreeSet;
use std::time::Duration;

use lock_runtime::admin::LockKind;
use lock_runtime::{Client, Config, Lock};
use test_support::{RedisCluster, RedisServer};

fn cluster_url(cluster: &RedisCluster) -> String {
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{}", hosts.join(","))
}

/// The port of the primary holding `key`.
fn primary_of(cluster: &RedisCluster, key: &str) -> u16 {
    let reply = test_support::command(cluster.ports()[0], &["CLUSTER", "KEYSLOT", key]).unwrap();
    let slot: u16 = reply.trim_start_matches(':').trim().parse().unwrap();
    cluster.primary_of_slot(slot).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_the_locks_of_every_primary() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster_url(&cluster);
    let (holder, other) = (client(&url), client(&url));
    // Names until every primary holds at least two locks.
    let mut names = Vec::new();
    let mut per_primary = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0.. {
        let name = format!("job:{i}");
        let port = primary_of(&cluster, &format!("lock:{{{name}}}"));
        let count = per_primary.entry(port).or_default();
        if *count < 2 {
            *count += 1;
            names.push((name, port));
        }
        if per_primary.len() == 3 && per_primary.values().all(|&n| n == 2) {
            break;
        }
    }
    let mut guards = Vec::new();
    for (name, _) in &names {
        let guard = Lock::new(name.as_str())
            .ttl(Duration::from_secs(60))
            .client(holder.clone())
            .try_acquire()
            .await
            .unwrap();
        guards.push(guard);
    }

    let list = lockctl(&url, &["list", "job:"], "").await;
    assert_eq!(list.code, 0, "{list:?}");
    let mut found_on = BTreeSet::new();
    for ((name, port), guard) in names.iter().zip(&guards) {
        let columns = row(&list.stdout, name).unwrap_or_else(|| panic!("{name}: {list:?}"));
        assert_eq!(columns["HOLDER"], guard.token()[..8], "{list:?}");
        found_on.insert(*port);
    }
    assert_eq!(found_on.len(), 3, "locks on every primary were listed");
    assert_eq!(list.stdout.lines().count(), names.len() + 1, "{list:?}");
    // The holder's record, on the primary of its own hash tag's slot, names
    // it beside the locks of every primary.
    let instance = holder.instance().to_owned();
    list_until(&url, "every lock names its holder", |list| {
        names
            .iter()
            .all(|(name, _)| row(&list.stdout, name).is_some_and(|row| row["INSTANCE"] == instance))
    })
    .await;

    // A forced release on the cluster wakes a waiter of another client.
    let (name, _) = &names[0];
    let waiter = spawn_waiter(&other, name);
    let waiters_key = format!("lock:{{{name}}}:waiters");
    let port = primary_of(&cluster, &waiters_key);
    wait_until("the waiter queues", || {
        test_support::command(port, &["ZCARD", &waiters_key]).unwrap() == ":1\r\n"
    })
    .await;
    // Its client listens on its channel before the release.
    let queue = format!("lock:{{{name}}}:queue");
    let channel =
        queued_channel(&test_support::command(port, &["LRANGE", &queue, "0", "-1"]).unwrap());
    wait_until("the waiter's client listens", || {
        numsub(&test_support::command(port, &["PUBSUB", "SHARDNUMSUB", &channel]).unwrap()) == 1
    })
    .await;
    let show = lockctl(&url, &["show", name], "").await;
    assert!(show.stdout.contains("waiters:  1"), "{show:?}");
    let release = lockctl(&url, &["release", name, "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    assert!(
        release.stdout.contains("a waiting client was woken"),
        "{release:?}"
    );
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
    drop(guards);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lists_one_row_per_lock_and_releases_by_majority() {
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    let url = format!("redis-quorum://{}", hosts.join(","));
    let holder = Client::new(Config::new(url.as_str())).unwrap();
    open_connections(&holder, &nodes).await;
    let guard = Lock::new("ledger")
        .ttl(Duration::from_secs(60))
        .fencing()
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    // Held on a majority; the third node's grant, sent on its open
    // connection, may land after the acquisition returned.
    wait_until("every node holds the lock", || {
        nodes.iter().all(|node| {
            node.command(&["GET", "lock:{ledger}"])
                .unwrap()
                .contains(guard.token())
        })
    })
    .await;
    // A stray token on one node only (an attempt being given back): not a
    // holder.
    let stray = "ffffffffffffffffffffffffffffffff|qdeadbeef";
    nodes[0]
        .command(&["SET", "lock:{stray}", stray, "PX", "60000"])
        .unwrap();

    let list = lockctl(&url, &["list"], "").await;
    assert_eq!(list.code, 0, "{list:?}");
    let columns = row(&list.stdout, "ledger").expect("a row for ledger");
    assert_eq!(
        columns["HOLDER"],
        format!("{} on 3/3", &guard.token()[..8]),
        "{list:?}"
    );
    assert_eq!(
        columns["FENCE"],
        guard.fencing_token().unwrap().to_string(),
        "{list:?}"
    );
    let stray_row = row(&list.stdout, "stray").expect("a row for stray");
    assert_eq!(
        stray_row["HOLDER"], "-",
        "a minority token holds nothing: {list:?}"
    );

    // The holder's record is on every node.
    let instance = holder.instance().to_owned();
    list_until(&url, "the holder is named", |list| {
        row(&list.stdout, "ledger").is_some_and(|row| row["INSTANCE"] == instance)
    })
    .await;
    let record = format!("lock:client:{{{}}}", holder.id());
    for node in &nodes {
        wait_until("the record is on each node", || {
            node.command(&["EXISTS", &record]).unwrap() == ":1\r\n"
        })
        .await;
    }

    let admin = Client::new(Config::new(url.as_str())).unwrap();
    let info = admin.lock_info("stray").await.unwrap();
    assert_eq!(info[0].holders[0].nodes, 1);
    assert!(!info[0].is_held());
    assert!(admin
        .force_release("stray", LockKind::Exclusive)
        .await
        .unwrap()
        .is_empty());

    let release = lockctl(&url, &["release", "ledger", "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    assert!(release.stdout.contains("released"), "{release:?}");
    for node in &nodes {
        assert_eq!(
            node.command(&["EXISTS", "lock:{ledger}"]).unwrap(),
            ":0\r\n"
        );
    }
    assert!(guard.release().await.unwrap_err().is_lost());
}

/// Has the quorum client open its connections with calls that may fail,
/// until one is held on every node: a fresh client's first call waits for
/// the nodes it has not heard from yet only 10 ms once only they can make
/// the majority (lock-runtime's `DOWN_NODE_PATIENCE`, "or none yet"),
/// which new connections on a loaded machine miss ("no majority of the
/// quorum answered"). Then every node has answered this client and counts
/// as up.
async fn open_connections(client: &Client, nodes: &[RedisServer]) {
    let held =
        |node: &RedisServer| node.command(&["EXISTS", "lock:{warm-up}"]).unwrap() == ":1\r\n";
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the quorum client never had its call answered by every node"
        );
        // A 5 s ttl: each node gets 500 ms to answer an acquisition.
        let lock = Lock::new("warm-up")
            .ttl(Duration::from_secs(5))
            .client(client.clone());
        if let Ok(guard) = lock.try_acquire().await {
            // The nodes beyond the majority get a short grace: a call of
            // theirs may land a little after.
            let answered = std::time::Instant::now() + Duration::from_secs(1);
            let everywhere = loop {
                let everywhere = nodes.iter().all(held);
                if everywhere || std::time::Instant::now() > answered {
                    break everywhere;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            guard.release().await.unwrap();
            if everywhere {
                return;
            }
        }
        // A failed attempt is given back on the nodes that granted it in
        // the background: tried again once it is (a try at once would find
        // the last one's grant on one node and get only the others').
        wait_until("the warm-up is given back", || !nodes.iter().any(held)).await;
    }
}
