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
use std::time::{Duration, Instant};

use test_support::{Proxy, RedisCluster, RedisSentinel};

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

/// The sections recorded in `list` (`"START END ID"`, µs), sorted by
/// start.
fn sections(bookkeeping: &RedisServer, list: &str) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = records(bookkeeping, list)
        .into_iter()
        .map(|(start, end, _)| (start, end))
        .collect();
    all.sort_unstable();
    all
}

/// The ids of the sections recorded in `list`.
fn recorded_ids(bookkeeping: &RedisServer, list: &str) -> Vec<String> {
    records(bookkeeping, list)
        .into_iter()
        .map(|(_, _, id)| id)
        .collect()
}

/// The sections recorded in `list`: start, end, id.
fn records(bookkeeping: &RedisServer, list: &str) -> Vec<(u64, u64, String)> {
    bulk_items(&redis(bookkeeping, &["LRANGE", list, "0", "-1"]))
        .iter()
        .map(|item| {
            let fields: Vec<&str> = item.split(' ').collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[2].to_owned(),
            )
        })
        .collect()
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
    // A section stopped after its record was made (its reply on the way)
    // is in both lists: counted once.
    let ids: Vec<String> = recorded_ids(&bookkeeping, "count:sections");
    let cancelled: Vec<(u64, u64)> = records(&bookkeeping, "count:cancelled")
        .into_iter()
        .filter(|(_, _, id)| !ids.contains(id))
        .map(|(start, end, _)| (start, end))
        .collect();
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
    assert_eq!(
        busy_then_takeover(port, 300).join().unwrap(),
        ":1\r\n+OK\r\n"
    );
}

/// `CLUSTER FAILOVER FORCE`: the replica takes over without waiting for
/// its primary's last writes; the old primary learns of it from the
/// cluster bus and answers `MOVED` from then on. The releases and
/// in-process passes it took meanwhile are made good on the new primary.
///
/// Failed in 2-5 of 8 runs (1 of 6 at the start of the next stop) before
/// passes were made good as passes: a pass the new primary lacked was
/// sent again as a release of the passer's token, which deleted the key
/// under the holder the lock had been passed to, and a waiter of another
/// process took it (two sections overlapped, the counter one short; the
/// holder's release found the other's token). No overlap since: design
/// §15, "Forced Cluster failovers".
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

/// A lock passed between two tasks of a process while the replica about to
/// take over reads nothing (a script keeps it busy): the new primary has
/// the passer's token, the old one the next holder's. Once the process
/// learns of the switch, the new primary's copy must go to the next holder
/// (the pass made good as a pass), not be deleted under it, which let
/// another process take the lock while it ran (the overlap after `CLUSTER
/// FAILOVER FORCE`, design §15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_the_new_primary_missed_goes_to_the_next_holder_there() {
    let cluster = RedisCluster::start(3, 1);
    let port = cluster.ports()[0];
    let slot_of = |name: &str| slot_of(port, name);
    let primary = cluster.primary_of_slot(slot_of("passed")).unwrap();
    let replica = cluster.replica_of(primary).unwrap();
    // Another lock on the same primary: trying it makes the process learn
    // of the switch (a `MOVED`, the slot map fetched again).
    let touch = (0..1000)
        .map(|i| format!("touch-{i}"))
        .find(|name| cluster.primary_of_slot(slot_of(name)) == Some(primary))
        .unwrap();
    let mut worker = Process::spawn_with_env(
        env!("CARGO_BIN_EXE_lock-worker"),
        &["pass-on", "passed"],
        Some(&cluster_url(&cluster)),
        &[],
    );
    let held = worker.line(LINE_TIMEOUT);
    let passer = held.strip_prefix("held ").expect(&held).to_owned();
    let takeover = caught_up_then_busy(primary, replica);
    worker.send("pass");
    let passed = worker.line(LINE_TIMEOUT);
    let next = passed.strip_prefix("passed ").expect(&passed).to_owned();
    let key = "lock:{passed}";
    assert_eq!(get(primary, key), Some(next.clone()));
    assert_eq!(takeover.join().unwrap(), ":1\r\n+OK\r\n");
    wait_until("the replica is promoted", LINE_TIMEOUT, || {
        test_support::command(replica, &["ROLE"]).is_ok_and(|role| role.contains("master"))
    });
    assert_eq!(
        get(replica, key),
        Some(passer.clone()),
        "the new primary missed the pass"
    );
    assert_eq!(ask(&mut worker, &format!("touch {touch}")), "touched");
    wait_until("the new primary's copy is made good", LINE_TIMEOUT, || {
        get(replica, key) != Some(passer.clone())
    });
    assert_eq!(
        get(replica, key),
        Some(next),
        "the pass was made good as a release: the key was deleted under its holder"
    );
    assert_eq!(ask(&mut worker, "held"), "held");
}

/// An acquisition that learns of a switch within itself is held back as
/// one sent after it: a process whose slot map still names the old primary
/// sends its try there, gets `MOVED`, fetches the map (the switch learned
/// there) and sends the try again to the promoted replica, which lacks a
/// lock another process took on the old primary. Sent at once, it took the
/// lock while that holder, which learns of the switch about then, could
/// still be in its section (two sections overlapped after `CLUSTER
/// FAILOVER FORCE`, 1 run in 10-12 beside busy loops; design §15): it
/// must wait out the hold-back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_that_learns_of_a_switch_within_itself_is_held_back() {
    let cluster = RedisCluster::start(3, 1);
    let url = cluster_url(&cluster);
    let primary = cluster
        .primary_of_slot(slot_of(cluster.ports()[0], "moved"))
        .unwrap();
    let replica = cluster.replica_of(primary).unwrap();
    let mut first = holder(&url, 0);
    // Its slot map fetched now, before the switch.
    let mut late = holder(&url, 0);
    let takeover = caught_up_then_busy(primary, replica);
    assert_eq!(ask(&mut first, "try moved 60000"), "acquired");
    assert_eq!(takeover.join().unwrap(), ":1\r\n+OK\r\n");
    let key = "lock:{moved}";
    wait_until("the old primary redirects", LINE_TIMEOUT, || {
        test_support::command(primary, &["GET", key]).is_ok_and(|reply| reply.starts_with("-MOVED"))
    });
    assert_eq!(get(replica, key), None, "the new primary has the lock");
    let asked = std::time::Instant::now();
    assert_eq!(ask(&mut late, "try moved 60000"), "acquired");
    let took = asked.elapsed();
    println!("the try that learned of the switch answered after {took:?}");
    assert!(
        took >= Duration::from_millis(500),
        "taken on the new primary {took:?} after it was asked for, without the hold-back"
    );
}

/// Waits until the replica on `replica` has read everything its primary
/// (on `primary`) wrote, then keeps it busy for a second (it answers `BUSY`
/// after 50 ms) and has it take over after that, without what its primary
/// was told meanwhile; returns once it is busy, with the takeover's
/// replies to come.
fn caught_up_then_busy(primary: u16, replica: u16) -> std::thread::JoinHandle<String> {
    wait_until("the replica has caught up", LINE_TIMEOUT, || {
        let wanted = repl_offset(primary, "master_repl_offset:");
        wanted.is_some() && repl_offset(replica, "slave_repl_offset:") == wanted
    });
    let reply =
        test_support::command(replica, &["CONFIG", "SET", "busy-reply-threshold", "50"]).unwrap();
    assert!(reply.starts_with("+OK"), "{reply}");
    let takeover = busy_then_takeover(replica, 1_000);
    wait_until("the replica is busy", LINE_TIMEOUT, || {
        test_support::command(replica, &["PING"]).is_ok_and(|reply| reply.starts_with("-BUSY"))
    });
    takeover
}

/// The slot of the lock named `name`, as the cluster node on `port` says.
fn slot_of(port: u16, name: &str) -> u16 {
    let key = format!("lock:{{{name}}}");
    value(&test_support::command(port, &["CLUSTER", "KEYSLOT", &key]).unwrap())
        .unwrap()
        .parse()
        .unwrap()
}

/// A replication offset (`field`: `master_repl_offset:` or
/// `slave_repl_offset:`) of the data node on `port`.
fn repl_offset(port: u16, field: &str) -> Option<u64> {
    let info = test_support::command(port, &["INFO", "replication"]).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|offset| offset.trim().parse().ok())
}

/// Runs, on the replica on `port`, a script that keeps it busy for
/// `millis` ms, then `CLUSTER FAILOVER TAKEOVER`, in one pipeline; the
/// replies, once both came.
fn busy_then_takeover(port: u16, millis: u64) -> std::thread::JoinHandle<String> {
    use std::io::{Read, Write};
    let busy = format!(
        "local t = redis.call('TIME') \
         local stop = t[1] * 1000000 + t[2] + {micros} \
         repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop \
         return 1",
        micros = millis * 1000
    );
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
    let pipeline = command(&["EVAL", &busy, "0"]) + &command(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    stream.write_all(pipeline.as_bytes()).unwrap();
    std::thread::spawn(move || {
        let mut replies = String::new();
        let mut buffer = [0u8; 1024];
        while !(replies.contains("+OK") || replies.contains("-ERR")) {
            let read = stream.read(&mut buffer).unwrap();
            assert!(read > 0, "the replica closed the connection: {replies:?}");
            replies.push_str(&String::from_utf8_lossy(&buffer[..read]));
        }
        replies
    })
}

/// A `holder` worker locking through `url` (in acknowledged mode with
/// `acknowledged` replicas when not 0), its sentinel connections opened.
fn holder(url: &str, acknowledged: u32) -> Process {
    let replicas = acknowledged.to_string();
    let env: &[(&str, &str)] = if acknowledged > 0 {
        &[("LOCK_ACKNOWLEDGED", replicas.as_str())]
    } else {
        &[]
    };
    let mut worker = Process::spawn_with_env(
        env!("CARGO_BIN_EXE_lock-worker"),
        &["holder"],
        Some(url),
        env,
    );
    let key = format!("warm-{}", worker.pid());
    assert_eq!(ask(&mut worker, &format!("try {key} 10000")), "acquired");
    assert_eq!(ask(&mut worker, &format!("release {key}")), "released");
    worker
}

/// Sends `line` to `worker` and returns its answer.
fn ask(worker: &mut Process, line: &str) -> String {
    worker.send(line);
    worker.line(LINE_TIMEOUT)
}

/// `GET key` on the data node on `port`.
fn get(port: u16, key: &str) -> Option<String> {
    value(&test_support::command(port, &["GET", key]).ok()?)
}

/// The port of the primary the data node on `port` replicates, if it is a
/// replica with its link up.
fn replicating(port: u16) -> Option<u16> {
    let info = test_support::command(port, &["INFO", "replication"]).ok()?;
    if !info.contains("master_link_status:up") {
        return None;
    }
    info.lines()
        .find_map(|line| line.strip_prefix("master_port:"))
        .and_then(|port| port.trim().parse().ok())
}

/// Takes `key` (ttl 30 s) through `worker` on the primary on `port`: asked
/// again (released first, or found lost by its release when the worker
/// learned of the switch in between) while the answer lands elsewhere (the
/// worker had not learned of the switch yet) or is refused (the new
/// primary's replica still syncing), a bounded number of times.
/// Takes `key` with `worker` on the primary on `port` (the new one), its
/// tries that landed on the old primary (`old`) given back there.
fn take_on(worker: &mut Process, key: &str, port: u16, old: u16) {
    let lock_key = format!("lock:{{{key}}}");
    let taken = (0..50).any(|_| {
        let answer = ask(worker, &format!("try {key} 30000"));
        if answer == "acquired" && get(port, &lock_key).is_some() {
            return true;
        }
        if answer == "acquired" {
            // Taken on the old primary; a switch learned since moves the
            // release to the new one, which never had the key: lost.
            let released = ask(worker, &format!("release {key}"));
            assert!(
                released == "released" || released == "lost Deleted",
                "{released}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
        false
    });
    assert!(taken, "`{key}` was never taken on the primary on {port}");
    // A copy the worker's tries left on the old primary (a try taken there
    // whose release went to the new one; the first send of a try sent again
    // to the new primary) stays for its ttl (30 s) on the old primary,
    // where the late process's try of the key must find it free: it found
    // it busy in 1 of 10 runs beside busy loops. Not the scenario's: gone.
    let reply = test_support::command(old, &["DEL", &lock_key]).unwrap();
    assert!(reply.starts_with(':'), "{reply}");
}

/// Two primaries at once after `SENTINEL FAILOVER`: the old one takes
/// writes until a sentinel converts it to a replica (about 11 s after the
/// announcement). Processes that have not learned of the switch (their
/// sentinel connections cut, so no `+switch-master` reaches them and they
/// cannot ask) go on locking there, while those that learned lock on the
/// new one. Shown with one failover:
///
/// - without acknowledged mode, two Ok holders: a late process takes on
///   the old primary a lock held on the new one;
/// - in acknowledged mode with one replica of two: while the old
///   primary's other replica still follows it (from the promotion until
///   the sentinels move it, about a second; held open here by stopping
///   the sentinels), an acquisition there is confirmed, and lost: a
///   process that learned of the switch takes the same lock on the new
///   primary, two Ok holders again; once that replica has moved, a late
///   acquisition is refused (`NotReplicated`);
/// - asking every replica (two of two) refuses the late acquisition from
///   the promotion on: the promoted replica left first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_has_not_learned_of_a_switch_locks_on_the_old_primary() {
    let setup = RedisSentinel::start();
    let old = setup.primary().unwrap();
    let proxies: Vec<Proxy> = setup
        .sentinel_ports()
        .iter()
        .map(|port| Proxy::start(*port))
        .collect();
    let through_proxies = format!(
        "redis-sentinel://{}/{}",
        proxies
            .iter()
            .map(|proxy| format!("127.0.0.1:{}", proxy.port()))
            .collect::<Vec<_>>()
            .join(","),
        setup.master_name()
    );
    let url = setup.url("");
    let (mut early, mut early_acked) = (holder(&url, 0), holder(&url, 1));
    let mut late = holder(&through_proxies, 0);
    let mut late_acked = holder(&through_proxies, 1);
    let mut late_acked_all = holder(&through_proxies, 2);
    // The late ones hear from no sentinel from now on.
    for proxy in &proxies {
        proxy.refuse(true);
        proxy.drop_all();
    }
    let replicas: Vec<u16> = setup.replicas_of(old);
    assert_eq!(replicas.len(), 2);
    let asked = Instant::now();
    setup.failover().unwrap();
    let mut new = 0;
    wait_until("a replica is promoted", LINE_TIMEOUT, || {
        new = replicas
            .iter()
            .copied()
            .find(|replica| {
                test_support::command(*replica, &["ROLE"]).is_ok_and(|role| role.contains("master"))
            })
            .unwrap_or(0);
        new != 0
    });
    let promoted = asked.elapsed();
    // The sentinels stopped a moment: the other replica still follows the
    // old primary.
    let other = *replicas.iter().find(|replica| **replica != new).unwrap();
    let sentinels: Vec<&RedisServer> = (0..3).filter_map(|i| setup.sentinel(i)).collect();
    for sentinel in &sentinels {
        signal(sentinel, "-STOP");
    }
    let still = replicating(other) == Some(old);
    let confirmed = ask(&mut late_acked, "try three 30000");
    let all = ask(&mut late_acked_all, "try four 30000");
    let still = still && replicating(other) == Some(old);
    for sentinel in &sentinels {
        signal(sentinel, "-CONT");
    }
    assert!(
        still,
        "the sentinels moved the other replica within moments of the promotion"
    );
    println!("acknowledged by 1 of 2, on the old primary after the promotion: {confirmed}");
    println!("acknowledged by 2 of 2, the same: {all}");
    assert_eq!(confirmed, "acquired");
    assert!(get(old, "lock:{three}").is_some());
    assert!(all.starts_with("error: not-replicated"), "{all}");
    assert_eq!(get(old, "lock:{four}"), None);

    let (mut moved, mut announced) = (None, None);
    wait_until("the switch is announced", LINE_TIMEOUT, || {
        if moved.is_none() && replicating(other) != Some(old) {
            moved = Some(asked.elapsed());
        }
        if setup
            .named_primaries()
            .iter()
            .any(|named| named.is_some_and(|port| port != old))
        {
            announced.get_or_insert(asked.elapsed());
        }
        announced.is_some() && moved.is_some()
    });
    let (moved, announced) = (moved.unwrap(), announced.unwrap());
    println!(
        "SENTINEL FAILOVER: replica promoted after {promoted:?}, the other replica left the old \
         primary after {moved:?} (the sentinels stopped a moment), switch announced after \
         {announced:?}"
    );

    // The early processes lock on the new primary.
    take_on(&mut early, "one", new, old);
    take_on(&mut early_acked, "two", new, old);
    take_on(&mut early_acked, "three", new, old);
    // Without acknowledged mode: the late process takes `one` on the old
    // primary while the early one holds it on the new one.
    assert_eq!(ask(&mut late, "try one 30000"), "acquired");
    assert!(get(old, "lock:{one}").is_some());
    for (worker, key) in [
        (&mut early, "one"),
        (&mut late, "one"),
        (&mut early_acked, "three"),
        (&mut late_acked, "three"),
    ] {
        assert_eq!(ask(worker, &format!("held {key}")), "held", "{key}");
    }
    // In acknowledged mode, after the other replica moved: refused.
    let refused = ask(&mut late_acked, "try two 30000");
    println!("acknowledged by 1 of 2, on the old primary after the switch: {refused}");
    assert!(refused.starts_with("error: not-replicated"), "{refused}");
    assert_eq!(get(old, "lock:{two}"), None);

    // How long the old primary takes writes: until the late process's
    // tries stop succeeding (a sentinel converted it: `READONLY`).
    let mut taken = 0;
    wait_until(
        "the old primary stops taking writes",
        Duration::from_secs(60),
        || {
            taken += 1;
            let answer = ask(&mut late, &format!("try probe-{taken} 1000"));
            if answer == "acquired" {
                std::thread::sleep(Duration::from_millis(100));
                return false;
            }
            true
        },
    );
    println!(
        "the old primary took writes until {:?} after the switch was announced",
        asked.elapsed() - announced
    );
}

/// Measures (ignored: it takes minutes; run it by name with `--ignored`)
/// what a SIGKILLed primary costs behind Redis Sentinel with
/// `down-after-milliseconds` 1000, 5000 and 30000 (Redis's default), two
/// replicas: the time from the kill to the promotion, to the announcement
/// (`+switch-master`), and to the first section of three worker processes
/// (the attribute, renewed, ttl 10 s), and which renewed locks taken
/// before the kill (ttl 2 s to 60 s) survived. Printed, for the guide's
/// failover section (a renewed lock survives when its ttl exceeds 1.5
/// times the failover: its last renewal may have been due right at the
/// kill, a third of a ttl after the one before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of several minutes; run by name with --ignored"]
async fn failover_durations() {
    for down_after in [1000u64, 5000, 30000] {
        failover_duration(down_after).await;
    }
}

async fn failover_duration(down_after: u64) {
    let mut setup = RedisSentinel::try_start_with(
        2,
        3,
        test_support::SentinelOptions {
            down_after_ms: Some(down_after),
            ..Default::default()
        },
    )
    .unwrap();
    let old = setup.primary().unwrap();
    let replicas = setup.replicas_of(old);
    let url = setup.url("");
    let bookkeeping = RedisServer::start();
    let client = lock_runtime::Client::new(lock_runtime::Config::new(url.as_str())).unwrap();
    let ttls = [2u64, 3, 5, 8, 10, 15, 20, 30, 45, 60];
    let mut held = Vec::new();
    for ttl in ttls {
        let guard = lock_runtime::Lock::new(format!("held-{ttl}"))
            .ttl(Duration::from_secs(ttl))
            .renew()
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap();
        held.push((ttl, guard));
    }
    let mut workers: Vec<Process> = (0..3)
        .map(|_| sections_worker(&url, &bookkeeping, "timed", 3))
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    setup.wait_until_replicated().unwrap();
    let killed_us = server_time_us(&bookkeeping);
    let killed = Instant::now();
    setup.kill_node(old);
    let (mut promoted, mut announced) = (None, None);
    wait_until("the switch is announced", Duration::from_secs(120), || {
        if promoted.is_none()
            && replicas.iter().any(|replica| {
                test_support::command(*replica, &["ROLE"]).is_ok_and(|role| role.contains("master"))
            })
        {
            promoted = Some(killed.elapsed());
        }
        if setup
            .named_primaries()
            .iter()
            .any(|named| named.is_some_and(|port| port != old))
        {
            announced = Some(killed.elapsed());
        }
        announced.is_some()
    });
    let mut first = None;
    wait_until_async(
        "a section runs after the failover",
        Duration::from_secs(60),
        || {
            first = sections(&bookkeeping, "count:sections")
                .iter()
                .map(|(start, _)| *start)
                .find(|start| *start > killed_us + down_after * 1000);
            first.is_some()
        },
    )
    .await;
    let first = Duration::from_micros(first.unwrap() - killed_us);
    // Each renewed lock: lost, or renewed on the new primary.
    let failed_over = Instant::now();
    let mut fates = Vec::new();
    for (ttl, guard) in &held {
        wait_until_async(
            "the lock is lost or renewed",
            Duration::from_secs(90),
            || {
                let ttl = Duration::from_secs(*ttl);
                let margin = ttl / 100 + Duration::from_millis(2);
                !guard.is_held() || Instant::now() + guard.remaining() >= failed_over + ttl - margin
            },
        )
        .await;
        fates.push(format!(
            "{ttl} s {}",
            if guard.is_held() { "kept" } else { "lost" }
        ));
    }
    for worker in &mut workers {
        worker.send("stop");
        worker.line(LINE_TIMEOUT);
    }
    println!(
        "down-after-milliseconds {down_after}: SIGKILL -> promoted {:?}, announced {:?}, first \
         section {first:?}; renewed locks: {}",
        promoted.unwrap_or_default(),
        announced.unwrap(),
        fates.join(", ")
    );
}
