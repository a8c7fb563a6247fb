//! `lock-bench redlock`: RedLock over 5 (`--nodes N`: N) local redis-servers (issue 13), this
//! project (`redis-quorum://`) beside rslock (which takes the node URLs),
//! in one run: W1 (lock + unlock pairs in sequence, one locker) and W3
//! (8 contenders with their own clients, ~1 ms sections).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use test_support::RedisServer;

use crate::compare::{self, w3};
use crate::implementations::{Kind, Locker};
use crate::option;
use crate::process_usage::{self, cpu_time, redis_cpu};
use crate::target::Target;

/// Independent nodes (five here).
pub(crate) struct Quorum(pub(crate) Vec<RedisServer>);

impl Target for Quorum {
    fn client_url(&self) -> String {
        let hosts: Vec<String> = self
            .0
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        format!("redis-quorum://{}", hosts.join(","))
    }

    fn ports(&self) -> Vec<u16> {
        self.0.iter().map(RedisServer::port).collect()
    }

    fn port_of(&self, _key: &str) -> u16 {
        self.0[0].port()
    }
}

pub(crate) fn main(args: &[String]) -> ExitCode {
    let pairs: usize = option(args, "--pairs").map_or(2000, |pairs| pairs.parse().unwrap());
    let rounds: usize = option(args, "--rounds").map_or(5, |n| n.parse().unwrap());
    let sections: usize = option(args, "--sections").map_or(500, |n| n.parse().unwrap());
    // `--only w1`, `w2` or `w3` (W2 only when asked); `--kinds ours` or
    // `rslock`: a part (for profiling).
    let only = option(args, "--only").unwrap_or_else(|| "w1,w3".to_owned());
    let kinds = option(args, "--kinds").unwrap_or_else(|| "ours,rslock".to_owned());
    let wanted = |kind: Kind| match kind {
        Kind::Rslock => kinds.contains("rslock"),
        _ => kinds.contains("ours"),
    };
    // `--nodes 3`: another quorum size (5 by default).
    let nodes: usize = option(args, "--nodes").map_or(5, |n| n.parse().unwrap());
    let quorum = Quorum((0..nodes).map(|_| RedisServer::start()).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // One round trip to one node, for scale.
    let rtt = runtime.block_on(async {
        let mut connection = redis::Client::open(quorum.0[0].url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let started = Instant::now();
        for _ in 0..1000 {
            let _: String = redis::cmd("PING")
                .query_async(&mut connection)
                .await
                .unwrap();
        }
        started.elapsed() / 1000
    });
    println!("## RedLock over {nodes} local nodes (issue 13): this project beside rslock\n");
    println!(
        "One PING round trip to one node: {:.0} µs.\n",
        rtt.as_secs_f64() * 1e6
    );
    println!("| workload | implementation | pairs or sections/s | µs per pair (wall) | pair in node round trips | client CPU µs/pair | Redis CPU µs/pair ({nodes} nodes) | Redis commands per pair | hand-off p50 / p99 | wait p50 / p99 |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|---|");
    // W1 interleaved in rounds, so that the machine's changing load falls on
    // both alike; the ratio is the median of the rounds'.
    let w1 = [
        (Kind::Manual, "this project"),
        (Kind::Rslock, "rslock 0.10"),
    ];
    let w1: Vec<_> = w1
        .into_iter()
        .filter(|(kind, _)| only.contains("w1") && wanted(*kind))
        .collect();
    let mut totals = vec![Sequential::default(); w1.len()];
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let mut rates = Vec::new();
        for (i, (kind, _)) in w1.iter().enumerate() {
            let round = runtime.block_on(sequential(&quorum, *kind, pairs / rounds));
            rates.push((pairs / rounds) as f64 / round.wall.as_secs_f64());
            totals[i].add(&round);
        }
        if rates.len() == 2 {
            ratios.push(rates[0] / rates[1]);
        }
    }
    for ((_, name), total) in w1.iter().zip(&totals) {
        let n = (pairs / rounds * rounds) as f64;
        let per = total.wall.as_secs_f64() / n;
        println!(
            "| W1: {pairs} lock + unlock pairs in sequence ({rounds} rounds) | {name} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | | |",
            1.0 / per,
            per * 1e6,
            per / rtt.as_secs_f64(),
            total.cpu.as_secs_f64() * 1e6 / n,
            total.redis_cpu.as_secs_f64() * 1e6 / n,
            total.commands as f64 / n,
        );
    }
    for ((_, name), total) in w1.iter().zip(&totals) {
        let n = (pairs / rounds * rounds) as f64;
        let rows = compare::command_breakdown(&Default::default(), &total.stats, n);
        println!(
            "\nW1 {name}, Redis commands per pair by command (calls, command µs from INFO commandstats): {}",
            compare::breakdown_text(&rows)
        );
    }
    print_ratios("W1", rounds, &mut ratios);
    if only.contains("w2") {
        runtime.block_on(w2(&quorum, pairs, rounds, &wanted));
    }
    for (kind, name) in [
        (Kind::ManualWait, "this project"),
        (Kind::Rslock, "rslock 0.10"),
    ] {
        if !only.contains("w3") || !wanted(kind) {
            continue;
        }
        let result = runtime.block_on(w3(&quorum, kind, sections, 8, false, true));
        let ms = |duration: Duration| format!("{:.2}", duration.as_secs_f64() * 1e3);
        println!(
            "| W3: 8 contenders, {sections} sections of ~1 ms | {name} | {:.0} | | | {:.1} | | | {} / {} ms | {} / {} ms |",
            result.rate,
            result.client_cpu.as_secs_f64() * 1e6,
            ms(result.handoff[0]),
            ms(result.handoff[1]),
            ms(result.wait[0]),
            ms(result.wait[1]),
        );
    }
    ExitCode::SUCCESS
}

/// W2 over the quorum: 50 tasks sharing one client, each on a key of its
/// own, `pairs` pairs in all, interleaved in `rounds` rounds; each side's
/// pairs per second and client CPU per pair, and the median of the rounds'
/// ratios. The case where calls made at once on one client meet on each
/// node's connection.
async fn w2(quorum: &Quorum, pairs: usize, rounds: usize, wanted: &impl Fn(Kind) -> bool) {
    const TASKS: usize = 50;
    let per_task = (pairs / rounds / TASKS).max(1);
    let mut lockers = Vec::new();
    for (kind, name) in [
        (Kind::Manual, "this project"),
        (Kind::Rslock, "rslock 0.10"),
    ] {
        if !wanted(kind) {
            continue;
        }
        let shared = Locker::new(kind, &quorum.client_url(), "redlock-w2:warm", false).await;
        let mut warm = shared.for_key("redlock-w2:warm");
        let held = warm.lock().await;
        warm.unlock(held).await;
        lockers.push((name, kind, shared, [Duration::ZERO; 3], 0u64));
    }
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let mut rates = Vec::new();
        for (_, kind, shared, [wall, cpu, server_cpu], commands) in &mut lockers {
            let (server_before, commands_before) = (redis_cpu(quorum), compare::commands(quorum));
            let (started, before) = (Instant::now(), cpu_time());
            compare::many_keys(shared, &format!("redlock-w2:{kind:?}"), TASKS, per_task).await;
            let elapsed = started.elapsed();
            *wall += elapsed;
            *cpu += cpu_time() - before;
            *server_cpu += redis_cpu(quorum) - server_before;
            // Each node's INFO reading counts itself once.
            *commands += compare::commands(quorum) - commands_before - quorum.0.len() as u64;
            rates.push((TASKS * per_task) as f64 / elapsed.as_secs_f64());
        }
        if rates.len() == 2 {
            ratios.push(rates[0] / rates[1]);
        }
    }
    let done = (TASKS * per_task * rounds) as f64;
    for (name, _, _, [wall, cpu, server_cpu], commands) in &lockers {
        println!(
            "| W2: {TASKS} tasks on one client, each its own key, {done} pairs ({rounds} rounds) | {name} | {:.0} | | | {:.1} | {:.1} | {:.1} | | |",
            done / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / done,
            server_cpu.as_secs_f64() * 1e6 / done,
            *commands as f64 / done,
        );
    }
    print_ratios("W2", rounds, &mut ratios);
}

/// The median and range of `ratios` (this project × rslock, one per
/// round), if there are any.
fn print_ratios(workload: &str, rounds: usize, ratios: &mut [f64]) {
    if ratios.is_empty() {
        return;
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "\n{workload} this project × rslock, median of {rounds} rounds: {:.2} (range {:.2}-{:.2})\n",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// What a run of pairs in sequence cost.
#[derive(Clone, Default)]
struct Sequential {
    wall: Duration,
    cpu: Duration,
    redis_cpu: Duration,
    commands: u64,
    /// Per command: calls and command µs (INFO commandstats), every node's.
    stats: std::collections::BTreeMap<String, (u64, u64)>,
}

impl Sequential {
    fn add(&mut self, other: &Sequential) {
        self.wall += other.wall;
        self.cpu += other.cpu;
        self.redis_cpu += other.redis_cpu;
        self.commands += other.commands;
        for (name, (calls, usec)) in &other.stats {
            let entry = self.stats.entry(name.clone()).or_default();
            entry.0 += calls;
            entry.1 += usec;
        }
    }
}

/// `pairs` lock + unlock pairs in sequence: wall time, client CPU, every
/// node's CPU and commands (less the readings' own INFO calls).
async fn sequential(quorum: &Quorum, kind: Kind, pairs: usize) -> Sequential {
    let mut locker = Locker::new(kind, &quorum.client_url(), "redlock-w1", false).await;
    let held = locker.lock().await;
    locker.unlock(held).await; // warm: connections, scripts
    let (redis_cpu, commands) = (redis_cpu(quorum), compare::commands(quorum));
    let stats = compare::command_stats(quorum);
    let (started, cpu) = (Instant::now(), cpu_time());
    for _ in 0..pairs {
        let held = locker.lock().await;
        locker.unlock(held).await;
    }
    let (wall, cpu) = (started.elapsed(), cpu_time() - cpu);
    let after = compare::command_stats(quorum);
    Sequential {
        stats: compare::command_breakdown(&stats, &after, 1.0)
            .into_iter()
            .map(|(name, calls, usec)| (name, (calls as u64, usec as u64)))
            .collect(),
        wall,
        cpu,
        redis_cpu: process_usage::redis_cpu(quorum) - redis_cpu,
        // Each node's INFO commandstats reading counts itself once.
        commands: compare::commands(quorum) - commands - quorum.0.len() as u64,
    }
}
