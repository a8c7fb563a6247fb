//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

pub use test_support::{Process, RedisServer};

/// Generous bound for a worker's next line: only hit when something hangs.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts the `lock-worker` binary in `mode` against `server`.
pub fn worker(server: &RedisServer, args: &[&str]) -> Process {
    Process::spawn(env!("CARGO_BIN_EXE_lock-worker"), args, Some(&server.url()))
}

/// Sends a command to the server, returning the raw RESP reply.
pub fn redis(server: &RedisServer, args: &[&str]) -> String {
    server
        .command(args)
        .unwrap_or_else(|error| panic!("{args:?}: {error}"))
}

/// The value of a RESP bulk or integer reply (`None` for nil).
pub fn value(reply: &str) -> Option<String> {
    match reply.as_bytes().first() {
        Some(b'$') if reply.starts_with("$-1") => None,
        Some(b'$') => reply.split("\r\n").nth(1).map(str::to_owned),
        Some(b':') | Some(b'+') => Some(reply[1..].trim_end().to_owned()),
        _ => panic!("unexpected reply {reply:?}"),
    }
}

/// Calls of `command` (lower case) Redis has run so far, those made by
/// scripts included (`INFO commandstats`).
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let stats = redis(server, &["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Waits (bounded) until `condition` holds, checking every few milliseconds.
/// For waiting on Redis-side state such as a key's expiry, which sends no
/// signal.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`wait_until`] for async tests: yields to the runtime between checks, so
/// background tasks on a current-thread runtime make progress.
pub async fn wait_until_async(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Makes `client` hold `key` for its cohort (the in-process hand-off): the
/// lock is first held by another client, so `client`'s acquire waits in
/// Redis as its representative (a free lock is taken with a plain SET NX,
/// outside any cohort, and released plainly).
pub async fn cohort_holder(
    server: &RedisServer,
    client: &lock_runtime::Client,
    key: &str,
    ttl: Duration,
) -> lock_runtime::LockGuard {
    use lock_runtime::{Client, Config, Lock};
    let other = Client::new(Config::new(server.url())).unwrap();
    let first = Lock::new(key).client(other).acquire().await.unwrap();
    let holder = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(ttl)
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move { lock.acquire().await.unwrap() }
    });
    let queue = format!("lock:{{{key}}}:queue");
    wait_until_async("the holder waits in Redis", LINE_TIMEOUT, || {
        redis(server, &["LLEN", &queue]) == ":1\r\n"
    })
    .await;
    first.release().await.unwrap();
    holder.await.unwrap()
}

/// Sends `server` a signal (`-STOP`, `-CONT`).
pub fn signal(server: &RedisServer, name: &str) {
    let status = std::process::Command::new("kill")
        .args([name, &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The `redis-quorum://` URL of `nodes`.
pub fn quorum_url(nodes: &[RedisServer]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    format!("redis-quorum://{}", hosts.join(","))
}

/// A client of the quorum of `nodes`, with 1 s connect and response
/// timeouts (a stopped node is not waited for by the calls that a majority
/// decides; a live node on a loaded machine has time to answer).
pub fn quorum_client(nodes: &[RedisServer]) -> lock_runtime::Client {
    use lock_runtime::{Client, Config};
    Client::new(
        Config::new(quorum_url(nodes))
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    )
    .unwrap()
}

/// [`quorum_client`] with its connection to every node open (read once from
/// each node): a call it makes reaches every node, even one whose answer is
/// not waited for (its connection is not still being made when the call
/// settles on a majority).
pub async fn ready_quorum_client(nodes: &[RedisServer]) -> lock_runtime::Client {
    let client = quorum_client(nodes);
    client.lock_info("ready").await.expect("every node answers");
    client
}

/// A task of `client` waiting up to `wait` for the lock `name`.
pub fn spawn_waiter(
    client: &lock_runtime::Client,
    name: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>> {
    let lock = lock_runtime::Lock::new(name)
        .wait(wait)
        .client(client.clone());
    tokio::spawn(async move { lock.acquire().await })
}

/// The guard a [`spawn_waiter`] task got (within [`LINE_TIMEOUT`]).
pub async fn waited(
    waiter: tokio::task::JoinHandle<Result<lock_runtime::LockGuard, lock_runtime::LockError>>,
) -> lock_runtime::LockGuard {
    tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("the waiter got an answer in time")
        .expect("the waiter task ran")
        .expect("the waiter got the lock")
}

/// Has the quorum client open its connections (over TLS too: a handshake
/// each) with calls that may fail, until one is held on every node of `up`:
/// a fresh client's first call waits for the nodes it has not heard from yet
/// only briefly once only they can make the majority, which new connections
/// on a loaded machine miss ("no majority of the quorum answered"). Then
/// those nodes have answered this client and count as up.
pub async fn open_connections(client: &lock_runtime::Client, up: &[RedisServer]) {
    let held = |node: &RedisServer| redis(node, &["EXISTS", "lock:{warm-up}"]) == ":1\r\n";
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        assert!(
            Instant::now() < deadline,
            "the quorum client never had its call answered by every node that is up"
        );
        // A 5 s ttl: each node gets 500 ms to answer an acquisition.
        let lock = lock_runtime::Lock::new("warm-up")
            .ttl(Duration::from_secs(5))
            .client(client.clone());
        if let Ok(guard) = lock.try_acquire().await {
            // The nodes beyond the majority get a short grace: a call of
            // theirs may land a little after.
            let answered = Instant::now() + Duration::from_secs(1);
            let everywhere = loop {
                let everywhere = up.iter().all(held);
                if everywhere || Instant::now() > answered {
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
        // the last one's grant on one node and get only the other's).
        wait_until_async("the warm-up is given back", LINE_TIMEOUT, || {
            !up.iter().any(held)
        })
        .await;
    }
}

/// A primary and a replica of it, in sync (acknowledged mode needs one).
pub fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica_port = test_support::free_port().unwrap();
    let replica = RedisServer::start_with(
        replica_port,
        &[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
            // Load the primary's data from the socket, not through a
            // dump.rdb written into the test's working directory.
            "--repl-diskless-load".to_owned(),
            "on-empty-db".to_owned(),
        ],
    )
    .unwrap();
    wait_until("the replica is in sync", LINE_TIMEOUT, || {
        redis(&replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    (primary, replica)
}
