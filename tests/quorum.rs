//! RedLock: one lock over N independent redis-server processes
//! (`Config::quorum`), held when a majority granted it within its validity.
//! Nodes are made unavailable by SIGSTOP or by another owner's key; a
//! failed attempt leaves nothing behind; a holder keeps its lock while a
//! minority is stopped and is told it lost it when a majority is; mutual
//! exclusion and increasing fencing tokens across processes while nodes
//! stop and resume.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};

fn quorum_url(nodes: &[RedisServer]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    format!("redis-quorum://{}", hosts.join(","))
}

fn client(nodes: &[RedisServer]) -> Client {
    Client::new(
        Config::new(quorum_url(nodes))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .unwrap()
}

/// The value of `key` on `node`, if any.
fn get(node: &RedisServer, key: &str) -> Option<String> {
    value(&redis(node, &["GET", key]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_taken_exactly_when_a_majority_is_free() {
    for n in [3usize, 5] {
        let nodes: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let client = client(&nodes);
        let key = "lock:{subset}";
        for mask in 0..(1u32 << n) {
            // Unavailable nodes: in turn stopped, or held by another owner.
            let unavailable: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let mut stopped = Vec::new();
            for (k, &i) in unavailable.iter().enumerate() {
                if k % 2 == 0 {
                    signal(&nodes[i], "-STOP");
                    stopped.push(i);
                } else {
                    redis(&nodes[i], &["SET", key, "other", "PX", "60000"]);
                }
            }
            let taken = Lock::new("subset")
                .ttl(Duration::from_secs(2))
                .client(client.clone())
                .try_acquire()
                .await;
            for &i in &stopped {
                signal(&nodes[i], "-CONT");
            }
            let free = n - unavailable.len();
            if free > n / 2 {
                let guard = taken.unwrap_or_else(|error| {
                    panic!("n={n}, unavailable {unavailable:?}: not taken: {error}")
                });
                guard.release().await.unwrap();
            } else {
                assert!(
                    matches!(
                        taken,
                        Err(LockError::Busy { .. }) | Err(LockError::Redis { .. })
                    ),
                    "n={n}, unavailable {unavailable:?}: {taken:?}"
                );
            }
            // Nothing left of the attempt on any node (a stopped node runs
            // the attempt and its give-back when it resumes), well before
            // the attempt's 2 s ttl would have removed it.
            wait_until(
                "no node keeps the attempt",
                Duration::from_millis(1000),
                || {
                    nodes
                        .iter()
                        .all(|node| get(node, key).is_none_or(|held| held == "other"))
                },
            );
            for node in &nodes {
                redis(node, &["DEL", key]);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_lock_with_a_minority_stopped_and_loses_it_with_a_majority() {
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let client = client(&nodes);
    let ttl = Duration::from_millis(900);
    let guard = Lock::new("kept")
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    // A minority stopped: renewals still reach a majority.
    signal(&nodes[0], "-STOP");
    signal(&nodes[1], "-STOP");
    let before = client.renewal_stats().renewals_sent;
    wait_until_async("three renewals", LINE_TIMEOUT, || {
        client.renewal_stats().renewals_sent >= before + 3
    })
    .await;
    assert!(guard.is_held(), "lost with only a minority stopped");
    // A majority stopped: told by the end of its validity.
    signal(&nodes[2], "-STOP");
    let stopped = Instant::now();
    wait_until_async("the holder is told", LINE_TIMEOUT, || !guard.is_held()).await;
    assert!(stopped.elapsed() < ttl + Duration::from_millis(700));
    for node in &nodes[..3] {
        signal(node, "-CONT");
    }
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// Mutual exclusion and fencing across processes: 3 processes x 2 tasks x
/// 8 fenced sections on one key over 5 nodes, while one node at a time is
/// stopped and resumed (a fixed sequence); the non-atomic counter is exact
/// and the fencing tokens, in the order the bodies ran, strictly increase.
#[test]
fn processes_exclude_each_other_and_tokens_increase_while_nodes_stop() {
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let bookkeeping = RedisServer::start();
    let url = quorum_url(&nodes);
    let mut workers: Vec<Process> = (0..3)
        .map(|_| {
            Process::spawn_with_env(
                env!("CARGO_BIN_EXE_lock-worker"),
                &["count", "quorum-counter", "2", "8", "counter"],
                Some(&url),
                &[("BOOKKEEPING_URL", &bookkeeping.url())],
            )
        })
        .collect();
    // A fixed sequence of single-node stops (a minority at any time).
    let mut seed: u32 = 12345;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let node = &nodes[(seed >> 16) as usize % nodes.len()];
                signal(node, "-STOP");
                std::thread::sleep(Duration::from_millis(150)); // the fault's length
                signal(node, "-CONT");
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        for worker in &mut workers {
            assert_eq!(worker.line(LINE_TIMEOUT * 4), "done");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let total: i64 = value(&redis(&bookkeeping, &["GET", "counter"]))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, 3 * 2 * 8);
    let fences = redis(&bookkeeping, &["LRANGE", "counter:fences", "0", "-1"]);
    let fences: Vec<u64> = fences
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .map(|line| line.parse().unwrap())
        .collect();
    assert_eq!(fences.len(), 3 * 2 * 8);
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens not increasing: {fences:?}"
    );
}

/// Fencing over different majorities: a node whose last token is far ahead
/// (its clock ahead, or tokens handed out there) grants the first
/// acquisition with the third node stopped; the second acquisition's
/// majority leaves that node out. Its token is still larger: the first
/// token was written back to a majority before it was handed out, and any
/// two majorities share a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_different_majorities() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = client(&nodes);
    let ahead: u64 = 4_000_000_000_000_000; // µs, far ahead of the clock (under 2^53)
    redis(
        &nodes[0],
        &["SET", "lock:{fenced}:fence", &ahead.to_string()],
    );
    let fenced = || {
        Lock::new("fenced")
            .fencing()
            .ttl(Duration::from_secs(2))
            .client(client.clone())
    };
    signal(&nodes[2], "-STOP");
    let first = fenced().try_acquire().await.unwrap();
    signal(&nodes[2], "-CONT");
    let first_token = first.fencing_token().unwrap();
    assert!(first_token > ahead);
    first.release().await.unwrap();
    signal(&nodes[0], "-STOP");
    let second = fenced().try_acquire().await;
    signal(&nodes[0], "-CONT");
    let second_token = second.unwrap().fencing_token().unwrap();
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}: a later majority handed out a smaller token"
    );
}
