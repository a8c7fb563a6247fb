//! Switches of primary during work (issue 38): `SENTINEL FAILOVER`,
//! `CLUSTER FAILOVER FORCE` and `CLUSTER FAILOVER TAKEOVER` while three
//! worker processes × three tasks run sections of one lock (ttl 10 s,
//! wait 15 s, renewed). A release (or renewal) sent to the old primary
//! after the replica was promoted never reaches the new one: before issue
//! 38 the lock's stale copy there held every waiter back until its ttl
//! passed. Each client now makes its recent releases and its renewals
//! good on the new primary once it learns of the switch (design §15,
//! §12). Checked: sections resume within about a second of the switch,
//! the counter they increment is exact, no two sections overlapped.

mod common;
use common::*;
use std::time::Duration;

use test_support::{RedisCluster, RedisSentinel};

/// A worker process running `switch-sections` on `key` through `url`, its
/// bookkeeping on `bookkeeping`.
fn sections_worker(url: &str, bookkeeping: &RedisServer, key: &str, tasks: usize) -> Process {
    let tasks = tasks.to_string();
    Process::spawn_with_env(
        env!("CARGO_BIN_EXE_lock-worker"),
        &["switch-sections", key, &tasks, "count"],
        Some(url),
        &[("BOOKKEEPING_URL", bookkeeping.url().as_str())],
    )
}

/// `server`'s clock in µs (`TIME`).
fn server_time_us(server: &RedisServer) -> u64 {
    let reply = redis(server, &["TIME"]);
    let parts: Vec<u64> = reply
        .split("\r\n")
        .filter_map(|line| line.parse().ok())
        .collect();
    parts[0] * 1_000_000 + parts[1]
}

/// The items of a RESP array reply of bulk strings.
fn bulk_items(reply: &str) -> Vec<String> {
    reply
        .split("\r\n")
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[0].starts_with('$') && pair[0] != "$-1")
        .map(|pair| pair[1].to_owned())
        .collect()
}

/// The sections recorded in `list` (`"START END"`, µs), sorted by start.
fn sections(bookkeeping: &RedisServer, list: &str) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = bulk_items(&redis(bookkeeping, &["LRANGE", list, "0", "-1"]))
        .iter()
        .map(|item| {
            let (start, end) = item.split_once(' ').unwrap();
            (start.parse().unwrap(), end.parse().unwrap())
        })
        .collect();
    all.sort_unstable();
    all
}

/// Three processes × three tasks run sections of `key` through `url`;
/// `switch` (given the bookkeeping server) switches the primary and
/// returns the bookkeeping clock (µs) when it was asked for and when the
/// switch was announced. Waits for 20 sections begun after the
/// announcement, stops the workers and checks the counter and the
/// overlaps. Returns the longest pause between two sections begun one
/// after the other from the request on (a stall lasts until the lock's
/// stale copy expires: up to its ttl, 10 s).
async fn sections_through(
    url: &str,
    key: &str,
    switch: impl FnOnce(&RedisServer) -> (u64, u64),
) -> Duration {
    let bookkeeping = RedisServer::start();
    let mut workers: Vec<Process> = (0..3)
        .map(|_| sections_worker(url, &bookkeeping, key, 3))
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    let (asked_us, switched_us) = switch(&bookkeeping);
    wait_until_async(
        "20 sections begin after the switch",
        Duration::from_secs(40),
        || {
            sections(&bookkeeping, "count:sections")
                .iter()
                .filter(|(start, _)| *start > switched_us)
                .count()
                >= 20
        },
    )
    .await;
    for worker in &mut workers {
        worker.send("stop");
    }
    for worker in &mut workers {
        let done = worker.line(LINE_TIMEOUT);
        println!("worker: {done}");
        assert!(done.starts_with("done ran="), "{done}");
    }
    let recorded = sections(&bookkeeping, "count:sections");
    let cancelled = sections(&bookkeeping, "count:cancelled");
    let counter: usize = value(&redis(&bookkeeping, &["GET", "count"]))
        .unwrap()
        .parse()
        .unwrap();
    // The longest pause between section starts, from the last section
    // begun before the request on.
    let starts: Vec<u64> = recorded.iter().map(|(start, _)| *start).collect();
    let from = starts
        .iter()
        .rposition(|start| *start <= asked_us)
        .unwrap_or(0);
    let (mut longest, mut at) = (Duration::ZERO, 0);
    for pair in starts[from..].windows(2) {
        let pause = Duration::from_micros(pair[1] - pair[0]);
        if pause > longest {
            (longest, at) = (pause, pair[0]);
        }
    }
    let first_after = starts.iter().find(|start| **start > switched_us).unwrap();
    println!(
        "{} sections ({} stopped by a lost lock); switch announced {:?} after it was asked \
         for; the first section after it began {:?} later; longest pause from the request on \
         {longest:?}, from {:?} after the announcement",
        recorded.len(),
        cancelled.len(),
        Duration::from_micros(switched_us.saturating_sub(asked_us)),
        Duration::from_micros(first_after - switched_us),
        Duration::from_micros(at.saturating_sub(switched_us)),
    );
    assert_eq!(counter, recorded.len(), "the counter lost updates");
    let mut all: Vec<(u64, u64)> = recorded.iter().chain(&cancelled).copied().collect();
    all.sort_unstable();
    for pair in all.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "two sections overlapped: {:?} and {:?} (switch at {switched_us})",
            pair[0],
            pair[1]
        );
    }
    longest
}

/// `SENTINEL FAILOVER` during work: the sentinels promote a replica at
/// once and announce `+switch-master` about a second later; the releases
/// sent to the old primary in that second are made good on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sections_resume_soon_after_a_sentinel_failover() {
    let setup = RedisSentinel::start();
    let old = setup.primary().unwrap();
    let url = setup.url("");
    let longest = sections_through(&url, "switch", |bookkeeping| {
        let asked = server_time_us(bookkeeping);
        setup.failover().unwrap();
        let mut announced = 0;
        wait_until("a sentinel announces the switch", LINE_TIMEOUT, || {
            let switched = setup
                .named_primaries()
                .iter()
                .any(|named| named.is_some_and(|port| port != old));
            if switched {
                announced = server_time_us(bookkeeping);
            }
            switched
        });
        (asked, announced)
    })
    .await;
    println!("SENTINEL FAILOVER: longest pause between sections {longest:?}");
    assert!(longest < Duration::from_secs(3), "{longest:?}");
}

fn cluster_url(cluster: &RedisCluster) -> String {
    let hosts: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    format!("redis-cluster://{}", hosts.join(","))
}

/// `CLUSTER FAILOVER <how>` on the replica of the primary of `key`'s slot
/// during work; the switch counts as announced when the replica says it is
/// the primary (`ROLE`).
async fn cluster_failover_during_work(how: &str) -> Duration {
    let cluster = RedisCluster::start(3, 1);
    let port = cluster.ports()[0];
    let slot: u16 =
        value(&test_support::command(port, &["CLUSTER", "KEYSLOT", "lock:{switch}"]).unwrap())
            .unwrap()
            .parse()
            .unwrap();
    let primary = cluster.primary_of_slot(slot).unwrap();
    let replica = cluster.replica_of(primary).unwrap();
    let url = cluster_url(&cluster);
    sections_through(&url, "switch", |bookkeeping| {
        let asked = server_time_us(bookkeeping);
        if how == "TAKEOVER" {
            lagging_takeover(replica);
        } else {
            let reply = test_support::command(replica, &["CLUSTER", "FAILOVER", how]).unwrap();
            assert!(reply.starts_with("+OK"), "{reply}");
        }
        let mut promoted = 0;
        wait_until("the replica is promoted", LINE_TIMEOUT, || {
            let role = test_support::command(replica, &["ROLE"]).unwrap();
            if role.contains("master") {
                promoted = server_time_us(bookkeeping);
            }
            promoted != 0
        });
        (asked, promoted)
    })
    .await
}

/// Busies the replica on `port` for 300 ms (a script that reads the
/// clock until then), then, in the same pipeline, runs `CLUSTER FAILOVER
/// TAKEOVER` there: it takes over at once, the last 300 ms of its
/// primary's writes still unread on its replication link (a replica that
/// lags 300 ms behind when it takes over, as under load). Without the
/// lag, the old primary hears of the takeover within a millisecond and
/// hardly any release is lost.
fn lagging_takeover(port: u16) {
    use std::io::{Read, Write};
    let busy = "local t = redis.call('TIME') \
        local stop = t[1] * 1000000 + t[2] + 300000 \
        repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop \
        return 1";
    let command = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for arg in args {
            out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        out
    };
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let pipeline = command(&["EVAL", busy, "0"]) + &command(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    stream.write_all(pipeline.as_bytes()).unwrap();
    let mut replies = String::new();
    let mut buffer = [0u8; 1024];
    while !(replies.contains("+OK") || replies.contains("-ERR")) {
        let read = stream.read(&mut buffer).unwrap();
        assert!(read > 0, "the replica closed the connection: {replies:?}");
        replies.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
    assert_eq!(replies, ":1\r\n+OK\r\n");
}

/// `CLUSTER FAILOVER FORCE`: the replica takes over without waiting for
/// its primary's last writes; the old primary learns of it from the
/// cluster bus and answers `MOVED` from then on. The releases it took
/// meanwhile are made good on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sections_resume_soon_after_a_forced_cluster_failover() {
    let longest = cluster_failover_during_work("FORCE").await;
    println!("CLUSTER FAILOVER FORCE: longest pause between sections {longest:?}");
    assert!(longest < Duration::from_secs(3), "{longest:?}");
}

/// `CLUSTER FAILOVER TAKEOVER` on a replica 300 ms behind its primary: it
/// takes the slots without even an election, without the writes it had
/// not read yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sections_resume_soon_after_a_cluster_takeover() {
    let longest = cluster_failover_during_work("TAKEOVER").await;
    println!("CLUSTER FAILOVER TAKEOVER: longest pause between sections {longest:?}");
    assert!(longest < Duration::from_secs(3), "{longest:?}");
}
