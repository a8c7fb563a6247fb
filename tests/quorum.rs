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

use futures_util::StreamExt;

use lock_runtime::{Client, Config, ConfigError, Lock, LockError};

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
            // A 4 s ttl: each node gets 400 ms to answer (a tenth of it).
            let taken = Lock::new("subset")
                .ttl(Duration::from_secs(4))
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
            } else if n - stopped.len() > n / 2 {
                // A majority answered, and too few of them were free.
                assert!(
                    matches!(taken, Err(LockError::Busy { .. })),
                    "n={n}, unavailable {unavailable:?}: {taken:?}"
                );
            } else {
                // Too few answered to tell: an error, never `Busy`.
                assert!(
                    matches!(&taken, Err(error @ LockError::Redis { .. }) if !error.is_busy()),
                    "n={n}, unavailable {unavailable:?}: {taken:?}"
                );
            }
            // Nothing left of the attempt on any node (a stopped node runs
            // the attempt and its give-back when it resumes), well before
            // the attempt's 4 s ttl would have removed it.
            let kept = || -> Vec<(usize, String)> {
                nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, node)| get(node, key).map(|held| (i, held)))
                    .filter(|(_, held)| held != "other")
                    .collect()
            };
            let deadline = std::time::Instant::now() + Duration::from_millis(3000);
            while !kept().is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "n={n}, unavailable {unavailable:?}, stopped {stopped:?}: nodes keep the \
                     attempt: {:?}",
                    kept()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            for node in &nodes {
                redis(node, &["DEL", key]);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_lock_with_a_minority_stopped_and_loses_it_with_a_majority() {
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let ttl = Duration::from_millis(1500);
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
    // By the end of its validity (at most a ttl after the last renewal);
    // the bound leaves room for a loaded machine.
    assert!(stopped.elapsed() < ttl + Duration::from_secs(2));
    for node in &nodes[..3] {
        signal(node, "-CONT");
    }
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// The same with nodes killed (SIGKILL) instead of stopped, and one of them
/// restarted empty: a renewed holder keeps its lock with 2 of 5 killed; a
/// renewal never re-creates the key on the restarted node (it extends, it
/// does not create: that node stays out of the hold); a third node killed
/// leaves 2 holding it, and the body run under the lock is stopped with
/// `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_rides_out_a_killed_minority_and_is_stopped_by_a_killed_majority() {
    let mut nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let ttl = Duration::from_millis(1500);
    let guard = Lock::new("killed")
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    wait_until_async("every node holds it", LINE_TIMEOUT, || {
        nodes
            .iter()
            .all(|node| value(&redis(node, &["GET", "lock:{killed}"])).is_some())
    })
    .await;
    nodes[0].kill();
    nodes[1].kill();
    let port = nodes[0].port();
    nodes[0] = RedisServer::start_on(port).unwrap();
    let before = client.renewal_stats().renewals_sent;
    wait_until_async("four renewals", LINE_TIMEOUT, || {
        client.renewal_stats().renewals_sent >= before + 4
    })
    .await;
    assert!(guard.is_held(), "lost with only a minority killed");
    assert_eq!(
        value(&redis(&nodes[0], &["GET", "lock:{killed}"])),
        None,
        "a renewal re-created the key on the node restarted without it"
    );
    // A third node killed: 2 of 5 hold it; the body is stopped.
    let body = guard.run(std::future::pending::<()>());
    nodes[2].kill();
    let killed = Instant::now();
    let stopped = tokio::time::timeout(LINE_TIMEOUT, body).await.unwrap();
    assert!(
        matches!(stopped, Err(LockError::Lost { .. })),
        "{stopped:?}"
    );
    assert!(killed.elapsed() < ttl + Duration::from_secs(2));
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
    /// Ends the faults when dropped, also when a worker's line panics
    /// (else the scope would wait for the fault thread forever).
    struct Done<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|scope| {
        let _done = Done(&done);
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
    let client = ready_quorum_client(&nodes).await;
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

/// Fencing with nodes restarted without their data (the delayed restarts
/// RedLock needs: a node rejoins empty only after the ttl): 4 processes x 2
/// tasks run fenced, renewed sections (2 s ttl) on one key over 5 nodes.
/// Meanwhile nodes are killed (SIGKILL), kept down past the ttl and started
/// again with no data, every node in turn and then again (more restarts
/// than any majority has nodes), and another is stopped now and then
/// (SIGSTOP). Sections go on after the last restart, and then the workers
/// stop. The non-atomic counter is exact and the tokens, in the order the
/// bodies ran, strictly increase: a restarted node's next token comes from
/// its clock, past every earlier token while the node clocks agree (here:
/// one machine).
#[test]
fn fencing_tokens_increase_while_nodes_restart_without_data() {
    const WORKERS: usize = 4;
    const RESTARTS: usize = 6;
    const TTL: Duration = Duration::from_secs(2);
    let mut nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let bookkeeping = RedisServer::start();
    let url = quorum_url(&nodes);
    let ttl_ms = TTL.as_millis().to_string();
    let mut workers: Vec<Process> = (0..WORKERS)
        .map(|_| {
            Process::spawn_with_env(
                env!("CARGO_BIN_EXE_lock-worker"),
                &["count-until-stop", "restarts", "2", "counter", &ttl_ms],
                Some(&url),
                &[("BOOKKEEPING_URL", &bookkeeping.url())],
            )
        })
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    let ran = || -> usize {
        redis(&bookkeeping, &["LLEN", "counter:fences"])
            .trim_start_matches(':')
            .trim()
            .parse()
            .unwrap()
    };
    let mut seed: u32 = 4242;
    let mut next = move || {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (seed >> 16) as usize
    };
    for round in 0..RESTARTS {
        // Every node in turn, then at random: no two down at once.
        let down = if round < nodes.len() {
            round
        } else {
            next() % nodes.len()
        };
        let port = nodes[down].port();
        nodes[down].kill();
        // Down past the ttl and the holders' validity; meanwhile another
        // node is stopped for a while: 2 of 5 unavailable. (The sleeps
        // shape the faults; they are lower bounds, longer is as good.)
        let stopped = (down + 1 + next() % (nodes.len() - 1)) % nodes.len();
        signal(&nodes[stopped], "-STOP");
        std::thread::sleep(Duration::from_millis(300));
        signal(&nodes[stopped], "-CONT");
        std::thread::sleep(TTL + Duration::from_millis(200));
        nodes[down] = RedisServer::start_on(port).expect("the node starts again on its port");
        // Sections go on with the restarted node back.
        let before = ran();
        wait_until("sections run after the restart", LINE_TIMEOUT, || {
            ran() >= before + 5
        });
    }
    for worker in &mut workers {
        worker.send("stop");
    }
    let mut total = 0;
    for worker in &mut workers {
        let done = worker.line(LINE_TIMEOUT * 4);
        let sections: usize = done
            .strip_prefix("done ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a worker failed: {done}"));
        total += sections;
    }
    let counted: usize = value(&redis(&bookkeeping, &["GET", "counter"]))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(counted, total);
    let fences = redis(&bookkeeping, &["LRANGE", "counter:fences", "0", "-1"]);
    let fences: Vec<u64> = fences
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .map(|line| line.parse().unwrap())
        .collect();
    assert_eq!(fences.len(), total);
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens not increasing: {fences:?}"
    );
}

/// How many restarts without data the quorum argument alone covers (design
/// §13), with tokens ahead of the node clocks (a clock ahead, or tokens
/// handed out there), so that only the nodes holding the first token can
/// carry it to the second acquisition. For N = 3 and N = 5, m = N/2+1:
/// - the first token reached only its majority (the others were down): the
///   next majority may share one node with it; that node kept its data: a
///   larger token; it restarted empty: a smaller one (0 restarts covered);
/// - the first token reached every node: any next majority shares m nodes
///   with it; m - 1 of them restarted empty: larger; all m: smaller
///   (m - 1 restarts covered: 1 for N = 3, 2 for N = 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_without_data_covered_by_the_quorum() {
    for size in [3, 5] {
        let m = size / 2 + 1;
        let all: Vec<usize> = (0..size).collect();
        // (first majority, restarted empty, second majority, larger)
        let scenarios: [Scenario; 4] = [
            (&all[..m], &[], &all[m - 1..], true),
            (&all[..m], &[m - 1], &all[m - 1..], false),
            (&all, &all[..m - 1], &all[..m], true),
            (&all, &all[..m], &all[..m], false),
        ];
        for (first_majority, restarted, second_majority, larger) in scenarios {
            let (first, second) =
                tokens_across_restarts(size, first_majority, restarted, second_majority).await;
            assert_eq!(
                second > first,
                larger,
                "N = {size}, first on {first_majority:?}, {restarted:?} restarted empty, \
                 second on {second_majority:?}: {second} after {first}"
            );
        }
    }
}

/// The nodes up for a first fenced acquisition, the nodes restarted
/// without data after it, the nodes up for the second, and whether its
/// token is larger.
type Scenario<'a> = (&'a [usize], &'a [usize], &'a [usize], bool);

/// The fencing tokens of two acquisitions of one key on `size` fresh nodes:
/// the first with only `first` up (the others are then restarted empty: the
/// token never reached them), `restarted` nodes restarted without data in
/// between, the second with only `second` up. Node 0 starts far ahead.
async fn tokens_across_restarts(
    size: usize,
    first: &[usize],
    restarted: &[usize],
    second: &[usize],
) -> (u64, u64) {
    let mut nodes: Vec<RedisServer> = (0..size).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let ahead: u64 = 4_000_000_000_000_000; // µs, far ahead of the clock (under 2^53)
    redis(
        &nodes[0],
        &["SET", "lock:{ahead}:fence", &ahead.to_string()],
    );
    // A 5 s ttl: each node gets 500 ms to answer, time enough to reconnect
    // to a restarted node on a loaded machine.
    let fenced = |client: &Client| {
        Lock::new("ahead")
            .fencing()
            .ttl(Duration::from_secs(5))
            .client(client.clone())
    };
    // A node restarted without its data: a new server, on a new port (so
    // that no call of the first client still on its way can reach it).
    let restart = |node: &mut RedisServer| {
        node.kill();
        *node = RedisServer::start();
    };
    let outside =
        |set: &[usize]| -> Vec<usize> { (0..size).filter(|index| !set.contains(index)).collect() };
    for index in outside(first) {
        signal(&nodes[index], "-STOP");
    }
    let guard = fenced(&client).try_acquire().await.unwrap();
    let first_token = guard.fencing_token().unwrap();
    assert!(first_token > ahead);
    // The nodes left out of the first majority lose what was sent to them
    // (the attempt, its write-back): killed now, and started again empty.
    for index in outside(first) {
        nodes[index].kill();
    }
    guard.release().await.unwrap();
    // The write-back is sent to every node; wait until each node of the
    // first majority has it (some get it after the acquisition held).
    let written = first_token.to_string();
    wait_until("the first token is written back", LINE_TIMEOUT, || {
        first.iter().all(|&index| {
            value(&redis(&nodes[index], &["GET", "lock:{ahead}:fence"])) == Some(written.clone())
        })
    });
    for index in outside(first).into_iter().chain(restarted.iter().copied()) {
        restart(&mut nodes[index]);
    }
    // The same quorum, as a client that starts now sees it.
    let client = quorum_client(&nodes);
    for index in outside(second) {
        signal(&nodes[index], "-STOP");
    }
    let guard = fenced(&client).try_acquire().await.unwrap();
    let second_token = guard.fencing_token().unwrap();
    for index in outside(second) {
        signal(&nodes[index], "-CONT");
    }
    guard.release().await.unwrap();
    (first_token, second_token)
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

/// With no majority reachable (3 of 5 nodes stopped or killed), every call
/// ends within its bounds with an error that says how many nodes answered
/// and which did not: a `Redis` error (`is_busy()` false), never `Busy` or
/// `WaitTimeout`, whether the nodes that answer hold another's key or
/// nothing. A try, a waiting acquire and the holder's release alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_majority_reachable_is_an_error_naming_the_silent_nodes() {
    let mut nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let (holder, other) = (quorum_client(&nodes), quorum_client(&nodes));
    let lock = |name: &str, client: &Client| {
        Lock::new(name)
            .ttl(Duration::from_secs(10))
            .client(client.clone())
    };
    let held = lock("reach", &holder).try_acquire().await.unwrap();
    // Connections opened first, so that the nodes' failures are what is
    // reported.
    lock("free", &other)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let silent: Vec<String> = nodes[..3]
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    signal(&nodes[0], "-STOP");
    signal(&nodes[1], "-STOP");
    nodes[2].kill();
    let says_so = |what: &str, result: Result<lock_runtime::LockGuard, LockError>| {
        let error = result.expect_err(what);
        assert!(
            matches!(error, LockError::Redis { .. }) && !error.is_busy(),
            "{what}: {error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("2 of 5 nodes"), "{what}: {message}");
        for node in &silent {
            assert!(
                message.contains(node.as_str()),
                "{what}: {node} not named: {message}"
            );
        }
    };
    // A new client whose only calls are short waits (each cut by the end
    // of the wait): the silent nodes are not counted as answers.
    let fresh = quorum_client(&nodes);
    says_so(
        "a new client's short wait",
        lock("reach", &fresh)
            .wait(Duration::from_millis(200))
            .acquire()
            .await,
    );
    // The two nodes that answer hold the lock for `holder`.
    says_so("a try", lock("reach", &other).try_acquire().await);
    says_so(
        "a try of a free lock",
        lock("free", &other).try_acquire().await,
    );
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let waited = lock("reach", &other).wait(wait).acquire().await;
    let took = started.elapsed();
    says_so("a waiting acquire", waited);
    assert!(
        took < wait + Duration::from_secs(3),
        "a wait of {wait:?} ended after {took:?}"
    );
    let released = held.release().await;
    for node in &nodes[..2] {
        signal(node, "-CONT");
    }
    let error = released.expect_err("a release two nodes answered");
    let message = error.to_string();
    assert!(
        matches!(error, LockError::Redis { .. }) && message.contains("2 of 5 nodes"),
        "{message}"
    );
}

/// A release reports `Lost` only when a majority no longer held the lock.
/// Here 1 node of 3 lost the key (deleted, as a restart without data does)
/// and 1 is stopped: 2 of 3 (the stopped one included) still hold it, so
/// the release cannot say it was lost (an error: too few answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_does_not_report_lost_when_a_silent_node_could_make_the_majority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
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
    // An error that says how the answers split, not that too few answered.
    let error = released.expect_err("1 node said gone, 1 mine, 1 silent: undecided");
    let message = error.to_string();
    assert!(
        matches!(error, LockError::Redis { .. })
            && message.contains("1 still held the lock, 1 no longer did, 1 did not answer")
            && message.contains(&format!("127.0.0.1:{}", nodes[2].port())),
        "{message}"
    );
}

/// A waiter that cannot complete its attempts (here its client cannot reach
/// one of the three nodes that are up, 2 of 5 being stopped) does not stay
/// first in line holding the others back for its whole wait: it leaves the
/// line after a failed attempt, and another client's waiter gets the lock
/// at once. Before, it kept its place on the nodes it could reach (each
/// attempt refreshed it), and the other waiter, first only where the first
/// could not reach, could never win until the first's wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_complete_an_attempt_steps_out_of_line() {
    use test_support::Proxy;
    let nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    // The first waiter reaches node 0 through a proxy, cut later.
    let proxy = Proxy::start(nodes[0].port());
    let mut urls = vec![proxy.url()];
    urls.extend(nodes[1..].iter().map(|node| node.url()));
    let cut_off = Client::new(
        Config::quorum(urls)
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let (holder, other) = (
        ready_quorum_client(&nodes).await,
        ready_quorum_client(&nodes).await,
    );
    let lock = |client: &Client, wait: Duration| {
        Lock::new("stuck")
            .ttl(Duration::from_secs(10))
            .wait(wait)
            .client(client.clone())
    };
    let held = lock(&holder, Duration::ZERO).try_acquire().await.unwrap();
    signal(&nodes[3], "-STOP");
    signal(&nodes[4], "-STOP");
    let first = {
        let lock = lock(&cut_off, LINE_TIMEOUT * 2);
        tokio::spawn(async move { lock.acquire().await })
    };
    let first_in_line = |count: &str| {
        nodes[..3]
            .iter()
            .all(|node| redis(node, &["ZCARD", "lock:{stuck}:tickets"]) == count)
    };
    wait_until_async(
        "the first waiter is in line on nodes 0-2",
        LINE_TIMEOUT,
        || first_in_line(":1\r\n"),
    )
    .await;
    let second = {
        let lock = lock(&other, LINE_TIMEOUT * 2);
        tokio::spawn(async move { lock.acquire().await })
    };
    wait_until_async("both wait in line on nodes 0-2", LINE_TIMEOUT, || {
        first_in_line(":2\r\n")
    })
    .await;
    proxy.refuse(true);
    proxy.drop_all();
    held.release().await.unwrap();
    let got = tokio::time::timeout(LINE_TIMEOUT, second).await;
    for node in &nodes[3..] {
        signal(node, "-CONT");
    }
    let guard = got
        .expect("the second waiter got the lock before the first's wait ran out")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    first.abort();
}

/// A key that a node holds with no expiry (not one of this library's: an
/// operator's `SET` without `PX`) makes a waiter sleep its longest pause,
/// not panic on an overflowing duration; its wait ends in `WaitTimeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_no_expiry_is_waited_for_without_overflow() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for node in &nodes {
        redis(node, &["SET", "lock:{forever}", "not-a-token"]);
    }
    let waited = Lock::new("forever")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_millis(300))
        .client(quorum_client(&nodes))
        .acquire()
        .await;
    assert!(
        matches!(waited, Err(LockError::WaitTimeout { .. })),
        "{waited:?}"
    );
}

/// Two renewed locks of one client, renewed in one batch. With one node of
/// 3 stopped, lock `a` is extended by the 2 others (a majority) every time;
/// lock `b` lost its key on one node, so its renewal is undecided: only `b`
/// is tried again, and `a` stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_lock_does_not_make_a_majority_renewed_lock_lost() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let ttl = Duration::from_secs(3);
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
    // Held past its ttl since node 2 stopped: renewed by nodes 0 and 1.
    let stopped = Instant::now();
    while stopped.elapsed() < ttl + Duration::from_millis(500) && a.is_held() {
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

/// A fenced acquisition's write-back settles as soon as a majority has the
/// token, like the acquisition itself: a stopped node does not hold it up
/// for its per-node timeout (a tenth of the ttl: 500 ms here). The stopped
/// node still gets the token once it resumes (every node that answers
/// does, so that later majorities find it on more nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_acquisition_is_not_held_up_by_a_stopped_minority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let fenced = || {
        Lock::new("fenced-stop")
            .fencing()
            .ttl(Duration::from_secs(10))
            .client(client.clone())
    };
    // Connections to every node opened first (and the fencing scripts
    // loaded on each), so that only the stopped node can hold it up.
    open_connections(&client, &nodes).await;
    fenced()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    signal(&nodes[2], "-STOP");
    let started = Instant::now();
    let guard = fenced().try_acquire().await;
    let elapsed = started.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    signal(&nodes[2], "-CONT");
    let token = guard.unwrap().fencing_token().unwrap();
    assert!(
        elapsed < Duration::from_millis(400),
        "a fenced acquisition took {elapsed:?} with one node of 3 stopped"
    );
    wait_until("the resumed node has the token", LINE_TIMEOUT, || {
        value(&redis(&nodes[2], &["GET", "lock:{fenced-stop}:fence"]))
            .is_some_and(|last| last.parse::<u64>().unwrap() >= token)
    });
}

/// A fenced attempt on a busy lock runs the acquire script, whose queue
/// bookkeeping must leave a quorum holder's value as it is: `<token>|q<mark
/// of its attempt>`. Rewritten to the bare token (as a stale wake mark is on
/// one server), a failed attempt's give-back, which deletes only its own
/// attempt's value, would find nothing to delete and leave the node held
/// by nobody until the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_fenced_attempt_leaves_the_holders_value_alone() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let holder = quorum_client(&nodes);
    let other = quorum_client(&nodes);
    let held = Lock::new("marked")
        .ttl(Duration::from_secs(10))
        .client(holder)
        .try_acquire()
        .await
        .unwrap();
    // Held on a majority at least (the third node may get it later).
    let before: Vec<Option<String>> = nodes
        .iter()
        .map(|node| get(node, "lock:{marked}"))
        .collect();
    let holding = before
        .iter()
        .filter(|value| value.as_deref() == Some(held.token()))
        .count();
    assert!(holding >= 2, "{before:?}");
    let busy = Lock::new("marked")
        .fencing()
        .client(other)
        .try_acquire()
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    // Every node that held the holder's value still holds it as it was.
    for (node, before) in nodes.iter().zip(&before) {
        if before.as_deref() == Some(held.token()) {
            assert_eq!(
                get(node, "lock:{marked}").as_deref(),
                Some(held.token()),
                "the holder's value was rewritten"
            );
        }
    }
    held.release().await.unwrap();
}

/// Waiters over a quorum stand in one line per node, ordered by the ticket
/// each sends unchanged to every node, and a release wakes the first of them.
/// A holder that releases and asks again at once (in the same task, so its
/// attempt goes out before the woken waiter's) finds the waiter in line and
/// stands behind it instead of taking the lock back. Five times in a row the
/// waiter gets the lock, and no place is left in any line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lock_goes_to_the_woken_waiter_not_back_to_its_holder() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let (first, second) = (quorum_client(&nodes), quorum_client(&nodes));
    let lock = |client: &Client| {
        Lock::new("woken")
            .ttl(Duration::from_secs(10))
            .wait(LINE_TIMEOUT)
            .client(client.clone())
    };
    // How many nodes have `waiters` in line.
    let in_line = |waiters: &'static str| {
        let nodes = &nodes;
        move || {
            nodes
                .iter()
                .filter(|node| redis(node, &["ZCARD", "lock:{woken}:tickets"]) == waiters)
                .count()
        }
    };
    let mut holder = lock(&first).acquire().await.unwrap();
    let (mut holding, mut waiting) = (&first, &second);
    for round in 0..5 {
        let waiter = {
            let lock = lock(waiting);
            tokio::spawn(async move { lock.acquire().await })
        };
        let one_in_line = in_line(":1\r\n");
        wait_until_async("the waiter is in line on a majority", LINE_TIMEOUT, || {
            one_in_line() >= 2
        })
        .await;
        holder.release().await.unwrap();
        let asking_again = lock(holding);
        let again = asking_again.acquire();
        tokio::pin!(again);
        let got = tokio::select! {
            biased;
            _ = &mut again => panic!("round {round}: the releasing client took the lock back first"),
            got = tokio::time::timeout(LINE_TIMEOUT, waiter) => got,
        };
        holder = got
            .expect("the woken waiter got an answer")
            .unwrap()
            .unwrap_or_else(|error| panic!("round {round}: the waiter failed: {error}"));
        // The old holder now waits behind the new one.
        std::mem::swap(&mut holding, &mut waiting);
        holder.release().await.unwrap();
        holder = tokio::time::timeout(LINE_TIMEOUT, again)
            .await
            .unwrap()
            .unwrap();
        std::mem::swap(&mut holding, &mut waiting);
        let none_in_line = in_line(":0\r\n");
        wait_until_async("no place is left in any line", LINE_TIMEOUT, || {
            none_in_line() == nodes.len()
        })
        .await;
    }
    holder.release().await.unwrap();
}

/// Quorum values carry no wake mark: with waiters in line, every node holds
/// the holder's value exactly as its attempt wrote it,
/// `<token>|q<8 hex digits>`, never followed by a waiter's entry (design
/// §13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_values_carry_no_wake_mark() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let lock = |wait: Duration| {
        Lock::new("unmarked")
            .ttl(Duration::from_secs(10))
            .wait(wait)
            .client(client.clone())
    };
    // Taken while two waiters stand in line (the holder itself waited).
    // Each waiter is a client of its own: tasks of one client queue in the
    // process, not in line.
    let first = lock(Duration::ZERO).try_acquire().await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let lock = lock(LINE_TIMEOUT).client(quorum_client(&nodes));
            tokio::spawn(async move { lock.acquire().await })
        })
        .collect();
    wait_until_async("three waiters in line on every node", LINE_TIMEOUT, || {
        nodes
            .iter()
            .all(|node| redis(node, &["ZCARD", "lock:{unmarked}:tickets"]) == ":3\r\n")
    })
    .await;
    first.release().await.unwrap();
    // Each waiter in the order they get the lock.
    let mut waiters: futures_util::stream::FuturesUnordered<_> = waiters.into_iter().collect();
    while let Some(guard) = tokio::time::timeout(LINE_TIMEOUT, waiters.next())
        .await
        .expect("a waiter got the lock in time")
    {
        let guard = guard.unwrap().unwrap();
        for node in &nodes {
            if let Some(held) = get(node, "lock:{unmarked}") {
                let (token, mark) = held.split_once("|q").expect("an attempt's value");
                assert!(
                    token.chars().all(|c| c.is_ascii_hexdigit())
                        && mark.len() == 8
                        && mark.chars().all(|c| c.is_ascii_hexdigit()),
                    "a quorum value with more than its attempt mark: {held:?}"
                );
            }
        }
        guard.release().await.unwrap();
    }
}

/// A waiter that gives up leaves the line on every node at once (not when
/// its place times out), so releases do not wake a waiter that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_every_nodes_queue() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let held = Lock::new("gone")
        .client(quorum_client(&nodes))
        .try_acquire()
        .await
        .unwrap();
    let waiter = {
        let lock = Lock::new("gone")
            .wait(Duration::from_secs(2))
            .client(client);
        tokio::spawn(async move { lock.acquire().await })
    };
    let in_line = |count: &str| {
        nodes
            .iter()
            .all(|node| redis(node, &["ZCARD", "lock:{gone}:tickets"]) == count)
    };
    wait_until_async("the waiter is in line on every node", LINE_TIMEOUT, || {
        in_line(":1\r\n")
    })
    .await;
    let waited = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(waited, Err(LockError::WaitTimeout { .. })),
        "{waited:?}"
    );
    // Without the leave, its place would stay in line until its refresh
    // deadline (2 s after its last attempt) and the line's key until twice
    // that: 3 s after the wait ended, only the leave can have emptied it.
    let left = Instant::now();
    wait_until_async("every node's line is empty", Duration::from_secs(3), || {
        in_line(":0\r\n")
    })
    .await;
    assert!(left.elapsed() < Duration::from_secs(3));
    drop(held);
}

/// `fair` is refused over a quorum (a configuration error naming the lock,
/// before anything is sent): the nodes' queues need not agree on who is
/// first, so serving each node's first waiter could leave nobody a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_is_refused_over_a_quorum() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let result = Lock::new("fair")
        .fair()
        .wait(Duration::from_secs(1))
        .client(quorum_client(&nodes))
        .acquire()
        .await;
    match result {
        Err(LockError::Config(ConfigError::Unsupported { name, reason })) => {
            assert_eq!(name, "fair");
            assert!(reason.contains("fair"), "{reason}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    assert!(nodes.iter().all(|node| get(node, "lock:{fair}").is_none()));
}

/// A stopped node does not make a waiter overrun its `wait`, even when the
/// live nodes split (one holds another client's minority attempt, one is
/// free): an attempt that a majority answered is settled at the wait's end
/// (the stopped node's per-node timeout, a tenth of the ttl, is not waited
/// out): `wait(50 ms)` gives `WaitTimeout` after about that long, not after
/// two per-node timeouts (1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_wait_is_kept_with_a_stopped_node_and_a_split_majority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    // Connections to every node opened first, each node heard from: the
    // live nodes' answers do not wait for a connection to be made (an
    // attempt settles at the end of the wait only once a majority answered).
    let client = ready_quorum_client(&nodes).await;
    open_connections(&client, &nodes).await;
    // Another client's minority attempt on node 1.
    redis(
        &nodes[1],
        &[
            "SET",
            "lock:{split}",
            "0123456789abcdef0123456789abcdef|q0badf00d",
            "PX",
            "10000",
        ],
    );
    signal(&nodes[0], "-STOP");
    let started = Instant::now();
    let waited = Lock::new("split")
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_millis(50))
        .client(client.clone())
        .acquire()
        .await;
    let elapsed = started.elapsed();
    signal(&nodes[0], "-CONT");
    assert!(
        matches!(waited, Err(LockError::WaitTimeout { .. })),
        "{waited:?}"
    );
    assert!(
        elapsed < Duration::from_millis(500),
        "wait(50 ms) returned after {elapsed:?} with one node of 3 stopped"
    );
}

/// A release over a quorum settles as soon as a majority released the
/// lock, like acquisitions and renewals: a stopped node does not make
/// `release().await` (and every `run` / attributed body) wait for the call
/// deadline (2 s here); the stopped node gets the release when it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_settles_without_a_stopped_minority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let lock = || {
        Lock::new("slow-release")
            .ttl(Duration::from_secs(10))
            .client(client.clone())
    };
    lock().try_acquire().await.unwrap().release().await.unwrap();
    let guard = lock().try_acquire().await.unwrap();
    signal(&nodes[2], "-STOP");
    let started = Instant::now();
    let released = guard.release().await;
    let elapsed = started.elapsed();
    signal(&nodes[2], "-CONT");
    released.unwrap();
    assert!(
        elapsed < Duration::from_secs(1),
        "release took {elapsed:?} with one node of 3 stopped"
    );
}

/// A ttl under 10 ms over a quorum is `ConfigError::InvalidTtl`, naming the
/// lock (the drift allowance, 1 % + 2 ms, and a round trip leave it no
/// validity), before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_ttl_under_10_ms_is_a_config_error() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    for ms in [4u64, 5, 9] {
        let taken = Lock::new("short")
            .ttl(Duration::from_millis(ms))
            .client(client.clone())
            .try_acquire()
            .await;
        match taken {
            Err(LockError::Config(ConfigError::InvalidTtl { name, .. })) => {
                assert_eq!(name, "short")
            }
            other => panic!("ttl {ms} ms over a quorum: expected InvalidTtl, got {other:?}"),
        }
    }
    assert!(nodes.iter().all(|node| get(node, "lock:{short}").is_none()));
}

/// An attempt that a majority granted but too late to hold (its validity
/// ran out, or its fencing write-back missed a majority in time) is given
/// back and says so, never "only 2 node(s) answered; a majority of 2 is
/// needed". Made reproducible with 3 ms round trips (a latency proxy in
/// front of each node), one node stopped and a fenced 12 ms lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_but_expired_attempt_says_so() {
    use lock_runtime::{Client, Config};
    use test_support::Proxy;
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let proxies: Vec<Proxy> = nodes.iter().map(|node| Proxy::start(node.port())).collect();
    let client = Client::new(
        Config::quorum(proxies.iter().map(Proxy::url))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let lock = |ttl: u64| {
        Lock::new("expired")
            .fencing()
            .ttl(Duration::from_millis(ttl))
            .client(client.clone())
    };
    // Connections opened (and the scripts cached) first.
    lock(10_000)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for proxy in &proxies {
        proxy.set_latency(Duration::from_micros(1500));
    }
    signal(&nodes[2], "-STOP");
    let mut seen = Vec::new();
    for _ in 0..30 {
        match lock(12).try_acquire().await {
            Err(LockError::Redis { source, .. }) => {
                let text = source.to_string();
                // "no majority ... answered: 2 of 3 nodes did, 2 are needed"
                // would contradict itself: 2 answers make a majority of 3.
                if text.contains("2 of 3 nodes did") || text.contains("3 of 3 nodes did") {
                    signal(&nodes[2], "-CONT");
                    panic!("a majority answered, yet reported as: {text}");
                }
                seen.push(text);
            }
            Ok(guard) => {
                let _ = guard.release().await;
                seen.push("held".to_owned());
            }
            Err(other) => seen.push(other.to_string()),
        }
    }
    signal(&nodes[2], "-CONT");
    eprintln!("{seen:?}");
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

/// Issue 36, hole 6: no majority answering is an error on every waiting
/// path, never `Busy`/`WaitTimeout` (design §13). Two of three nodes
/// stopped (SIGSTOP; they answered this client before, so it counts them
/// as up): a lock, a read share, a write lock and a permit, each with a
/// 50 ms wait on a free lock, again and again: each ends with a `Redis`
/// error (`is_busy()` false) within its wait and one call deadline (2 s),
/// plus slack. Before, an attempt cut by the end of the wait counted the
/// stopped nodes as possible refusals (they had answered their last call,
/// and a node cut off after 50 ms was not marked down), so every call
/// ended in `WaitTimeout`, for as long as the nodes stayed stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_majority_is_an_error_on_every_waiting_path_not_busy() {
    use lock_runtime::{RwLock, Semaphore};
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    open_connections(&client, &nodes).await;
    signal(&nodes[0], "-STOP");
    signal(&nodes[1], "-STOP");
    let wait = Duration::from_millis(50);
    let bound = wait + Duration::from_secs(2) + Duration::from_secs(2);
    let mut outcomes = Vec::new();
    for round in 0..3 {
        let calls: Vec<(&str, _)> = vec![
            ("lock", {
                let lock = Lock::new("free").wait(wait).client(client.clone());
                Box::pin(async move { lock.acquire().await.map(drop) })
                    as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>
            }),
            ("read", {
                let lock = RwLock::new("free-rw").client(client.clone());
                Box::pin(async move { lock.read().wait(wait).acquire().await.map(drop) })
            }),
            ("write", {
                let lock = RwLock::new("free-rw").client(client.clone());
                Box::pin(async move { lock.write().wait(wait).acquire().await.map(drop) })
            }),
            ("permit", {
                let lock = Semaphore::new("free-sem", 2).client(client.clone());
                Box::pin(async move { lock.wait(wait).acquire().await.map(drop) })
            }),
        ];
        for (what, call) in calls {
            let started = Instant::now();
            let result = call.await;
            let took = started.elapsed();
            outcomes.push(format!("{what} #{round}: {result:?} after {took:?}"));
            let error = match result {
                Err(error) => error,
                Ok(()) => panic!("{what} #{round} was taken with 2 of 3 nodes stopped"),
            };
            assert!(
                matches!(error, LockError::Redis { .. }) && !error.is_busy(),
                "{what} #{round}: {error:?} (all so far: {outcomes:#?})"
            );
            assert!(
                error.to_string().contains("no majority"),
                "{what} #{round}: {error}"
            );
            assert!(took < bound, "{what} #{round} took {took:?}");
        }
    }
    for node in &nodes[..2] {
        signal(node, "-CONT");
    }
    eprintln!("{outcomes:#?}");
}

/// Issue 36, hole 8: a waiter whose attempts fail keeps trying until its
/// wait ends, then returns the last Redis error, at most one call deadline
/// after the end (design §3, §13). Two of three nodes killed: every attempt
/// fails within milliseconds (refused connections). Before, the waiter gave
/// up as soon as its next pause (doubling, 20 ms to 500 ms) would pass the
/// end of its wait: after about 620 ms of a 1 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_waiter_keeps_trying_until_its_wait_ends() {
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    open_connections(&client, &nodes).await;
    nodes[0].kill();
    nodes[1].kill();
    let wait = Duration::from_secs(1);
    for round in 0..3 {
        let started = Instant::now();
        let error = Lock::new("gone")
            .wait(wait)
            .client(client.clone())
            .acquire()
            .await
            .expect_err("no majority is up");
        let took = started.elapsed();
        assert!(
            matches!(error, LockError::Redis { .. }) && !error.is_busy(),
            "#{round}: {error:?}"
        );
        assert!(
            took >= wait,
            "#{round}: the waiter gave up after {took:?} of its {wait:?}: {error}"
        );
        assert!(
            took < wait + Duration::from_secs(2) + Duration::from_secs(2),
            "#{round}: the waiter returned {took:?} after it began, its wait {wait:?}"
        );
    }
}

/// A try over a quorum is plain commands on each node (`SET NX PX`, the
/// line's `EXISTS`, `PTTL`: no script) and still lets the first waiter in
/// line have a free lock: a node where the try took it with waiters in line
/// gets it back, and the script decides there (design §13, "What a try
/// costs").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_is_plain_commands_and_still_defers_to_the_line() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let lock = Lock::new("plain")
        .ttl(Duration::from_secs(10))
        .client(client.clone());
    let try_lock = || lock.try_acquire();
    // Warm: connections and scripts.
    try_lock().await.unwrap().release().await.unwrap();
    let evalsha: Vec<u64> = nodes
        .iter()
        .map(|node| command_calls(node, "evalsha"))
        .collect();
    let guard = try_lock().await.expect("a free lock");
    // The try returns once a majority took it; the last node's part lands
    // moments later (heard out in the background, design §13).
    wait_until("every node has the lock", LINE_TIMEOUT, || {
        nodes.iter().all(|node| get(node, "lock:{plain}").is_some())
    });
    for (node, before) in nodes.iter().zip(&evalsha) {
        assert_eq!(
            command_calls(node, "evalsha"),
            *before,
            "an uncontended try ran a script"
        );
    }
    guard.release().await.unwrap();
    // A waiter of another client in line on every node (its place live for
    // a minute), the lock free: the try must leave it to that waiter.
    let waiter = "lock-waiters:other|waiter-token";
    for node in &nodes {
        redis(node, &["ZADD", "lock:{plain}:tickets", "1", waiter]);
        let deadline = {
            let time = redis(node, &["TIME"]);
            let seconds: u64 = time
                .split("\r\n")
                .nth(2)
                .and_then(|seconds| seconds.parse().ok())
                .expect("TIME");
            (seconds * 1000 + 60_000).to_string()
        };
        redis(node, &["ZADD", "lock:{plain}:waiters", &deadline, waiter]);
    }
    let taken = try_lock().await;
    assert!(
        matches!(taken, Err(LockError::Busy { .. })),
        "a try took a lock the first waiter in line was to have: {taken:?}"
    );
    // Given back on every node: on the last to answer, after the try
    // returned (a majority's answers decide it).
    wait_until_async(
        "the try gave the key back on every node",
        LINE_TIMEOUT,
        || nodes.iter().all(|node| get(node, "lock:{plain}").is_none()),
    )
    .await;
}

/// A lock held by another is `Busy`, not "too few nodes answered", when the
/// nodes that fail fail at once (2 of 5 killed: connections refused, and
/// not dialed again for a moment) and the first live node's refusal comes
/// before the other live nodes' answers: the attempt can no longer be
/// granted, but whether a majority answered is known only once they did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_busy_with_a_killed_minority() {
    let mut nodes: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let holder = Lock::new("held")
        .ttl(Duration::from_secs(30))
        .client(quorum_client(&nodes))
        .try_acquire()
        .await
        .unwrap();
    // Connections open to every node before two are killed.
    let client = ready_quorum_client(&nodes).await;
    for node in &mut nodes[..2] {
        node.kill();
    }
    for round in 0..50 {
        let taken = Lock::new("held").client(client.clone()).try_acquire().await;
        assert!(
            matches!(taken, Err(LockError::Busy { .. })),
            "try {round}: {taken:?}"
        );
    }
    drop(holder);
}
