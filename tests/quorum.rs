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

/// The value of `key` on `node`, if any.
fn get(node: &RedisServer, key: &str) -> Option<String> {
    value(&redis(node, &["GET", key]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_taken_exactly_when_a_majority_is_free() {
    for n in [3usize, 5] {
        let nodes: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let client = quorum_client(&nodes);
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
    let client = quorum_client(&nodes);
    let ttl = Duration::from_millis(900);
    let guard = Lock::new("kept")
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    wait_until("every node holds it", LINE_TIMEOUT, || {
        nodes
            .iter()
            .all(|node| value(&redis(node, &["GET", "lock:{kept}"])).is_some())
    });
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
    let client = quorum_client(&nodes);
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

/// Every node stopped: nobody holds the lock, no node answered; a try says
/// Redis did not answer, not that the lock is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_with_every_node_silent_is_an_error_not_busy() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    // Connections opened first.
    Lock::new("silent")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for node in &nodes {
        signal(node, "-STOP");
    }
    let taken = Lock::new("silent")
        .ttl(Duration::from_secs(2))
        .client(client.clone())
        .try_acquire()
        .await;
    for node in &nodes {
        signal(node, "-CONT");
    }
    assert!(
        matches!(taken, Err(LockError::Redis { .. })),
        "no node answered, yet: {taken:?}"
    );
}

/// A release reports `Lost` only when a majority no longer held the lock.
/// Here 1 node of 3 lost the key (deleted, as a restart without data does)
/// and 1 is stopped: 2 of 3 (the stopped one included) still hold it, so
/// the release cannot say it was lost (an error: too few answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_does_not_report_lost_when_a_silent_node_could_make_the_majority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let guard = Lock::new("told")
        .ttl(Duration::from_secs(10))
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    // Held on every node (the acquisition settles once a majority answered).
    wait_until("every node holds it", LINE_TIMEOUT, || {
        nodes
            .iter()
            .all(|node| value(&redis(node, &["GET", "lock:{told}"])).is_some())
    });
    // Node 0 forgets the key; node 2 stops. Nodes 0..2 hold it on 1 and 2.
    redis(&nodes[0], &["DEL", "lock:{told}"]);
    signal(&nodes[2], "-STOP");
    let released = guard.release().await;
    signal(&nodes[2], "-CONT");
    assert!(
        !matches!(released, Err(LockError::Lost { .. })),
        "1 node said gone, 1 mine, 1 silent (holding it): reported {released:?}"
    );
}

/// Two renewed locks of one client, renewed in one batch. With one node of
/// 3 stopped, lock `a` is extended by the 2 others (a majority) every time;
/// lock `b` lost its key on one node, so its renewal is undecided: only `b`
/// is tried again, and `a` stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_lock_does_not_make_a_majority_renewed_lock_lost() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let ttl = Duration::from_millis(1500);
    let a = Lock::new("batch-a")
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let b = Lock::new("batch-b")
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    redis(&nodes[0], &["DEL", "lock:{batch-b}"]);
    signal(&nodes[2], "-STOP");
    let stopped = Instant::now();
    while stopped.elapsed() < ttl * 2 && a.is_held() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_held = a.is_held();
    // `a` is still on a majority (0 and 1): extended each time.
    let pttl: Vec<String> = nodes[..2]
        .iter()
        .map(|node| redis(node, &["PTTL", "lock:{batch-a}"]))
        .collect();
    signal(&nodes[2], "-CONT");
    let stats = client.renewal_stats();
    drop(b);
    assert!(
        a_held,
        "`a` lost after {:?} although nodes 0 and 1 hold it (PTTL {pttl:?}); {stats:?}",
        stopped.elapsed()
    );
    a.release().await.unwrap();
}

/// A minority stopped is a state RedLock is meant to ride out: a waiter for
/// a busy lock with `wait(200 ms)` gives up about then (an attempt settles
/// as soon as a majority answered, the give-back runs in the background),
/// not after the stopped node's per-node timeout, twice, per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_not_overrun_with_a_minority_stopped() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let other = quorum_client(&nodes);
    let held = Lock::new("overrun")
        .ttl(Duration::from_secs(10))
        .client(other)
        .try_acquire()
        .await
        .unwrap();
    // Connections of the waiter's client opened first.
    Lock::new("warm")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    signal(&nodes[2], "-STOP");
    let started = Instant::now();
    let waited = Lock::new("overrun")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_millis(200))
        .client(client.clone())
        .acquire()
        .await;
    let elapsed = started.elapsed();
    signal(&nodes[2], "-CONT");
    drop(held);
    assert!(
        matches!(waited, Err(LockError::WaitTimeout { .. })),
        "{waited:?}"
    );
    assert!(
        elapsed < Duration::from_millis(700),
        "wait(200 ms) returned after {elapsed:?}"
    );
}

/// `redis-quorum://h1,h2,h3/3`: the database number is part of each node's
/// URL (as in `redis://h/3`): the locks go to database 3, not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_url_keeps_the_database_number() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = format!("{}/3", quorum_url(&nodes));
    let client = Client::new(Config::new(url)).unwrap();
    let guard = Lock::new("db")
        .ttl(Duration::from_secs(10))
        .client(client)
        .try_acquire()
        .await
        .unwrap();
    let in_db = |db: &str| {
        value(&redis(
            &nodes[0],
            &[
                "EVAL",
                "redis.call('SELECT', ARGV[1]); return redis.call('EXISTS', KEYS[1])",
                "1",
                "lock:{db}",
                db,
            ],
        ))
    };
    let (db0, db3) = (in_db("0"), in_db("3"));
    guard.release().await.unwrap();
    assert_eq!(
        (db0.as_deref(), db3.as_deref()),
        (Some("0"), Some("1")),
        "the lock key should be in database 3 only"
    );
}

/// The same node listed three times would count three times towards a
/// majority of one server: refused when the client is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_one_node_listed_thrice_is_refused_or_works() {
    let node = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/", node.port());
    let built = Client::new(Config::quorum([url.clone(), url.clone(), url]));
    let Ok(client) = built else {
        return; // refused at configuration: fine
    };
    let taken = Lock::new("thrice")
        .ttl(Duration::from_secs(5))
        .client(client)
        .try_acquire()
        .await;
    assert!(taken.is_ok(), "a free lock, a valid config: {taken:?}");
}
