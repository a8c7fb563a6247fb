//! In-process hand-off over a quorum (design §13, "In-process hand-off over
//! a quorum"): tasks of one client waiting for a lock another of its tasks
//! holds queue in the process, and the holder passes the lock to the next
//! with one script per node (`quorum_handoff.lua`), held once a majority
//! swapped its value for the next holder's.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::Lock;

/// The value of `key` on `node`, if any.
fn get(node: &RedisServer, key: &str) -> Option<String> {
    value(&redis(node, &["GET", key]))
}

/// A holder of `name` on `client` that holds it for its client's cohort (it
/// waited in Redis, behind another client, for the tasks queued behind it),
/// with `ttl`, and a task of the same client queued behind it in the process.
async fn holder_and_queued_waiter(
    nodes: &[RedisServer],
    client: &lock_runtime::Client,
    name: &str,
    ttl: Duration,
) -> (
    lock_runtime::LockGuard,
    tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>>,
) {
    let other = Lock::new(name)
        .client(quorum_client(nodes))
        .acquire()
        .await
        .unwrap();
    let holder = tokio::spawn({
        let lock = Lock::new(name)
            .ttl(ttl)
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move { lock.acquire().await.unwrap() }
    });
    let tickets = format!("lock:{{{name}}}:tickets");
    wait_until_async("the holder stands in line", LINE_TIMEOUT, || {
        nodes
            .iter()
            .all(|node| redis(node, &["ZCARD", &tickets]) == ":1\r\n")
    })
    .await;
    let waiter = spawn_waiter(client, name, Duration::from_secs(30));
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process(name) == 1
    })
    .await;
    other.release().await.unwrap();
    let holder = tokio::time::timeout(LINE_TIMEOUT, holder)
        .await
        .expect("the holder got the lock")
        .unwrap();
    (holder, waiter)
}

/// Whether `node` holds `key` with `value`.
fn holds(node: &RedisServer, key: &str, value: &str) -> bool {
    get(node, key).as_deref() == Some(value)
}

/// The next task gets the lock by a pass: the nodes that held its passer's
/// value (a majority; the third may have refused the passer's attempt, its
/// key still the other client's then) hold its token as it is (an
/// acquisition through Redis writes `<token>|q<attempt>`), and it never
/// stood in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_the_same_client_gets_the_lock_by_a_pass() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let (holder, waiter) =
        holder_and_queued_waiter(&nodes, &client, "passed", Duration::from_secs(10)).await;
    let first = holder.token().to_owned();
    assert!(first.contains("|q"), "taken through Redis: {first}");
    holder.release().await.unwrap();
    let guard = waited(waiter).await;
    let token = guard.token().to_owned();
    let key = "lock:{passed}";
    // The pass settles on a majority; the third node's part may still be
    // on its way, and then swaps the passer's value too.
    wait_until_async(
        "a majority holds the next token, no node another value",
        LINE_TIMEOUT,
        || {
            nodes.iter().filter(|node| holds(node, key, &token)).count() >= 2
                && nodes
                    .iter()
                    .all(|node| get(node, key).is_none_or(|held| held == token))
        },
    )
    .await;
    for node in &nodes {
        assert_eq!(redis(node, &["EXISTS", "lock:{passed}:tickets"]), ":0\r\n");
    }
    guard.release().await.unwrap();
    for node in &nodes {
        assert_eq!(get(node, key), None);
    }
}

/// A stopped node does not hold a pass up: with the other two holding the
/// passer's value, the next holder holds it on them, and its release frees
/// the lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_settles_on_a_majority_with_a_node_stopped() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let (holder, waiter, holding) =
        passer_and_nodes(&nodes, &client, "stopped", Duration::from_secs(10)).await;
    let key = "lock:{stopped}";
    // The node stopped is one the passer's majority can do without: the
    // one that refused its attempt, if one did.
    let stopped = (0..nodes.len()).find(|i| !holding.contains(i)).unwrap_or(0);
    let others: Vec<&RedisServer> = (0..nodes.len())
        .filter(|&i| i != stopped)
        .map(|i| &nodes[i])
        .collect();
    assert!(others.iter().all(|node| holds(node, key, holder.token())));
    signal(&nodes[stopped], "-STOP");
    holder.release().await.unwrap();
    let guard = waited(waiter).await;
    assert!(guard.is_held());
    let token = guard.token().to_owned();
    for node in &others {
        assert!(holds(node, key, &token));
    }
    guard.release().await.unwrap();
    signal(&nodes[stopped], "-CONT");
    for node in &others {
        assert_eq!(get(node, key), None);
    }
}

/// A fenced waiter is not passed the lock over a quorum (its token must be
/// written back to a majority): it waits in Redis, and its acquisition
/// there hands it a fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_waits_in_redis_not_in_the_process() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let holder = Lock::new("fenced")
        .ttl(Duration::from_secs(10))
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = Lock::new("fenced")
            .fencing()
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move { lock.acquire().await }
    });
    wait_until_async("the fenced waiter stands in line", LINE_TIMEOUT, || {
        nodes
            .iter()
            .filter(|node| redis(node, &["ZCARD", "lock:{fenced}:tickets"]) == ":1\r\n")
            .count()
            >= 2
    })
    .await;
    assert_eq!(client.waiting_in_process("fenced"), 0);
    holder.release().await.unwrap();
    let guard = waited(waiter).await;
    assert!(guard.fencing_token().is_some());
    assert!(guard.token().contains("|q"), "{}", guard.token());
    guard.release().await.unwrap();
}

/// A holder of `name` with `ttl` that waited in Redis for its client's
/// cohort, a task of the same client (the default ttl, 30 s) queued behind
/// it, and the nodes that hold the holder's value.
async fn passer_and_nodes(
    nodes: &[RedisServer],
    client: &lock_runtime::Client,
    name: &str,
    ttl: Duration,
) -> (
    lock_runtime::LockGuard,
    tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>>,
    Vec<usize>,
) {
    let (holder, waiter) = holder_and_queued_waiter(nodes, client, name, ttl).await;
    let key = format!("lock:{{{name}}}");
    let holding: Vec<usize> = (0..nodes.len())
        .filter(|&i| holds(&nodes[i], &key, holder.token()))
        .collect();
    assert!(
        holding.len() >= 2,
        "the passer holds a majority: {holding:?}"
    );
    (holder, waiter, holding)
}

/// How long a refused pass's next token may stay on a node: its release
/// is in the background (the next holder's ttl, 30 s, is what it stayed
/// before).
const GIVEN_BACK_WITHIN: Duration = Duration::from_secs(10);

/// A pass on the reply (the passer's validity is over: an unrenewed body
/// that outlived its ttl) refused by the majority whose keys expired, while
/// one node's key lived longer (a later grant, a slower clock) and swapped
/// the passer's value for the next token: that token is given back, not
/// left there for the next holder's ttl (found by a review; it stayed 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_on_the_reply_refused_by_a_majority_leaves_no_token_behind() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let (name, key) = ("refused-reply", "lock:{refused-reply}");
    let (holder, waiter, holding) =
        passer_and_nodes(&nodes, &client, name, Duration::from_millis(600)).await;
    let late = holding[0];
    redis(&nodes[late], &["PEXPIRE", key, "60000"]);
    wait_until_async("the other nodes' keys expired", LINE_TIMEOUT, || {
        (0..nodes.len()).all(|i| i == late || get(&nodes[i], key).is_none())
    })
    .await;
    let released = holder.release().await;
    assert!(
        matches!(released, Err(lock_runtime::LockError::Lost { .. })),
        "{released:?}"
    );
    waited(waiter).await.release().await.unwrap();
    wait_until_async("the late node holds nothing", GIVEN_BACK_WITHIN, || {
        get(&nodes[late], key).is_none()
    })
    .await;
}

/// An early pass refused (two nodes lost the key, as after restarts without
/// data): the next holder is told it lost the lock, and the token the one
/// node still holding the passer's value swapped in is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_pass_refused_by_a_majority_leaves_no_token_behind() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = ready_quorum_client(&nodes).await;
    let (name, key) = ("refused-early", "lock:{refused-early}");
    let (holder, waiter, holding) =
        passer_and_nodes(&nodes, &client, name, Duration::from_secs(30)).await;
    let kept = holding[0];
    for &i in &holding[1..] {
        redis(&nodes[i], &["DEL", key]);
    }
    let _ = holder.release().await;
    let guard = waited(waiter).await;
    let lost = guard.release().await;
    assert!(
        matches!(lost, Err(lock_runtime::LockError::Lost { .. })),
        "{lost:?}"
    );
    wait_until_async("the kept node holds nothing", GIVEN_BACK_WITHIN, || {
        get(&nodes[kept], key).is_none()
    })
    .await;
}
