//! `lock-bench cluster`: this project's manual API on a private Redis
//! Cluster of 3 primaries (no replicas) beside the same workloads on one
//! plain redis-server, in one run; prints a markdown table and whether the
//! cluster targets are met. Writes nothing.
//!
//! - W1: uncontended lock + unlock pairs in sequence on one client, the
//!   names `bench:<i>` (1024 of them, so spread over every primary's slots).
//! - W2: 50 tasks on one client, each on its own name `bench:w2:<task>`.
//! - W3: 8 contenders (own clients) for one name, ~1 ms sections
//!   (`compare`'s W3, with the contenders started and warm before it is
//!   measured).
//! - W4: 10,000 renewed locks (`bench:renewal:<n>`, ttl 1 s) held by one
//!   client.
//!
//! W1 and W2 alternate between the two in rounds, so that the machine's
//! changing load falls on both alike. `--scale 0.25` (default) runs a
//! quarter of `compare`'s W1-W3 work, `--seconds 10` (default) is W4's hold,
//! `--locks 10000` (default) its locks.

use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use test_support::{RedisCluster, RedisServer};

use crate::compare::{commands, machine, many_keys, ms, pair, percentile, w3, CONTENDERS};
use crate::implementations::{Kind, Locker};
use crate::option;
use crate::process_usage::{cpu_time, redis_cpu, redis_reads};
use crate::renewal::{hold_renewed, Renewed};
use crate::target::Target;

/// The project's target: a cluster's client CPU per pair at most this many
/// times one node's.
const CLIENT_CPU_TARGET: f64 = 1.2;
/// "W3 tails as on one node": the cluster's hand-off p50 and p99 at most
/// this many times one node's.
const TAIL_TARGET: f64 = 1.2;
/// W1's names: `bench:<i % NAMES>`.
const NAMES: usize = 1024;

pub(crate) fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        println!("usage: lock-bench cluster [--scale 0.25] [--seconds 10] [--locks 10000]");
        return ExitCode::SUCCESS;
    }
    let scale: f64 = option(args, "--scale").map_or(0.25, |s| s.parse().expect("--scale"));
    let seconds: f64 = option(args, "--seconds").map_or(10.0, |s| s.parse().expect("--seconds"));
    let locks: usize = option(args, "--locks").map_or(10_000, |s| s.parse().expect("--locks"));
    let single = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();

    // What the servers use doing nothing (cron; on a cluster also the
    // cluster bus), before any client: it is in every Redis figure below.
    let rest = Duration::from_secs(2);
    let at_rest = [
        idle_cpu(&single, rest).as_secs_f64(),
        idle_cpu(&cluster, rest).as_secs_f64(),
    ]
    .map(|cpu| 100.0 * cpu / rest.as_secs_f64());

    let w1_pairs = (20_000.0 * scale) as usize;
    let w1 = runtime.block_on(w1(&single, &cluster, w1_pairs));
    let w2_pairs = (50_000.0 * scale) as usize;
    let w2 = runtime.block_on(w2(&single, &cluster, w2_pairs));
    let sections = (2_000.0 * scale) as usize;
    let w3 = [
        runtime.block_on(w3(&single, Kind::Manual, sections, CONTENDERS, false, true)),
        runtime.block_on(w3(
            &cluster,
            Kind::Manual,
            sections,
            CONTENDERS,
            false,
            true,
        )),
    ];
    let hold = Duration::from_secs_f64(seconds);
    let ttl = Duration::from_secs(1);
    let w4 = [
        runtime.block_on(hold_renewed(&single, locks, ttl, hold, false)),
        runtime.block_on(hold_renewed(&cluster, locks, ttl, hold, false)),
    ];

    let mut report = machine(&single);
    report.push_str(&format!(
        "One node: one redis-server. Cluster: 3 primaries, no replicas (`redis-cluster://` client), every node on this machine. Redis CPU: every redis-server's INFO cpu (sys + user) added up; at rest (no client) {:.1} % of a core for one node, {:.1} % for the cluster. The workloads ran in {:.0} s.\n\n",
        at_rest[0],
        at_rest[1],
        started.elapsed().as_secs_f64()
    ));
    report.push_str(&table(
        &w1, &w2, &w3, &w4, w1_pairs, w2_pairs, sections, hold,
    ));
    report.push('\n');
    report.push_str(&targets(&w1, &w2, &w3, &w4));
    println!("{report}");
    if w3.iter().all(|result| result.counter_ok) && w4.iter().all(Renewed::kept) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What a run of pairs cost, added up over rounds.
#[derive(Default)]
struct Pairs {
    pairs: usize,
    elapsed: Duration,
    client_cpu: Duration,
    redis_cpu: Duration,
    /// Commands Redis ran (every node's), the readings' own included.
    commands: u64,
    /// Reads Redis made from client sockets (every node's), the readings'
    /// own included.
    reads: u64,
    /// [`measure`] calls added up.
    rounds: u64,
    /// What one [`measure`] call's own INFO calls count, in commands and
    /// reads (see [`readings`]).
    readings: (f64, f64),
    latencies: Vec<Duration>,
}

impl Pairs {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    /// Microseconds per pair.
    fn per_pair(&self, total: Duration) -> f64 {
        total.as_secs_f64() * 1e6 / self.pairs as f64
    }

    fn client_us(&self) -> f64 {
        self.per_pair(self.client_cpu)
    }

    fn redis_us(&self) -> f64 {
        self.per_pair(self.redis_cpu)
    }

    fn commands_per_pair(&self) -> f64 {
        (self.commands as f64 - self.rounds as f64 * self.readings.0) / self.pairs as f64
    }

    fn reads_per_pair(&self) -> f64 {
        (self.reads as f64 - self.rounds as f64 * self.readings.1) / self.pairs as f64
    }
}

/// Runs `work` (`pairs` lock + unlock pairs) on `target` and adds what it
/// cost to `into`. The client's CPU is read inside the Redis readings, so
/// that the INFO calls are not counted as the client's.
async fn measure(
    into: &mut Pairs,
    target: &impl Target,
    pairs: usize,
    work: impl Future<Output = ()>,
) {
    let commands_before = commands(target);
    let reads_before = redis_reads(target);
    let redis_before = redis_cpu(target);
    let client_before = cpu_time();
    let started = Instant::now();
    work.await;
    into.elapsed += started.elapsed();
    into.client_cpu += cpu_time() - client_before;
    into.redis_cpu += redis_cpu(target) - redis_before;
    into.reads += redis_reads(target) - reads_before;
    into.commands += commands(target) - commands_before;
    into.pairs += pairs;
    into.rounds += 1;
}

/// The commands and socket reads that [`measure`]'s own INFO calls count
/// on `target` (each on a connection of its own: its command, and its
/// close, are reads), from 10 measures of nothing.
async fn readings(target: &impl Target) -> (f64, f64) {
    let mut empty = Pairs::default();
    for _ in 0..10 {
        measure(&mut empty, target, 0, async {}).await;
    }
    (
        empty.commands as f64 / empty.rounds as f64,
        empty.reads as f64 / empty.rounds as f64,
    )
}

/// `pairs` pairs in sequence on the names `bench:<from>`... (modulo NAMES),
/// each pair's latency pushed to `latencies`.
async fn in_sequence(locker: &Locker, from: usize, pairs: usize, latencies: &mut Vec<Duration>) {
    for i in from..from + pairs {
        let name = format!("bench:{}", i % NAMES);
        let mut one = locker.for_key(&name);
        let at = Instant::now();
        pair(&mut one, &name).await;
        latencies.push(at.elapsed());
    }
}

/// W1 on one node and on the cluster, alternating in 20 rounds (which goes
/// first alternates too). Each client first takes every name once: its
/// connections are open and every node has the scripts.
async fn w1(single: &RedisServer, cluster: &RedisCluster, pairs: usize) -> [Pairs; 2] {
    const ROUNDS: usize = 20;
    let per_round = pairs / ROUNDS;
    let lockers = [
        Locker::new(Kind::Manual, &single.client_url(), "bench:0", false).await,
        Locker::new(Kind::Manual, &cluster.client_url(), "bench:0", false).await,
    ];
    for locker in &lockers {
        in_sequence(locker, 0, NAMES, &mut Vec::new()).await;
    }
    let mut results = [Pairs::default(), Pairs::default()];
    results[0].readings = readings(single).await;
    results[1].readings = readings(cluster).await;
    for round in 0..ROUNDS {
        let from = round * per_round;
        for side in order(round) {
            let (locker, result) = (&lockers[side], &mut results[side]);
            let mut latencies = Vec::with_capacity(per_round);
            let work = in_sequence(locker, from, per_round, &mut latencies);
            if side == 0 {
                measure(result, single, per_round, work).await;
            } else {
                measure(result, cluster, per_round, work).await;
            }
            result.latencies.append(&mut latencies);
        }
    }
    results
}

/// W2 on one node and on the cluster, alternating in 25 rounds of 50 tasks
/// on one client, each task on its own name.
async fn w2(single: &RedisServer, cluster: &RedisCluster, pairs: usize) -> [Pairs; 2] {
    const ROUNDS: usize = 25;
    const TASKS: usize = 50;
    const PREFIX: &str = "bench:w2";
    let per_task = pairs / ROUNDS / TASKS;
    let lockers = [
        Locker::new(Kind::Manual, &single.client_url(), PREFIX, false).await,
        Locker::new(Kind::Manual, &cluster.client_url(), PREFIX, false).await,
    ];
    for locker in &lockers {
        many_keys(locker, PREFIX, TASKS, 1).await;
    }
    let mut results = [Pairs::default(), Pairs::default()];
    results[0].readings = readings(single).await;
    results[1].readings = readings(cluster).await;
    for round in 0..ROUNDS {
        for side in order(round) {
            let (locker, result) = (&lockers[side], &mut results[side]);
            let work = many_keys(locker, PREFIX, TASKS, per_task);
            if side == 0 {
                measure(result, single, per_task * TASKS, work).await;
            } else {
                measure(result, cluster, per_task * TASKS, work).await;
            }
        }
    }
    results
}

/// Which side runs first in `round`: one node (0) in even rounds, the
/// cluster (1) in odd ones.
fn order(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

/// Redis CPU used by `target` over `period` with no client.
fn idle_cpu(target: &impl Target, period: Duration) -> Duration {
    let before = redis_cpu(target);
    std::thread::sleep(period);
    redis_cpu(target) - before
}

fn us(value: f64) -> String {
    format!("{value:.1} µs")
}

fn ratio(cluster: f64, single: f64) -> String {
    format!("{:.2}", cluster / single)
}

#[allow(clippy::too_many_arguments)]
fn table(
    w1: &[Pairs; 2],
    w2: &[Pairs; 2],
    w3: &[crate::compare::Contention; 2],
    w4: &[Renewed; 2],
    w1_pairs: usize,
    w2_pairs: usize,
    sections: usize,
    hold: Duration,
) -> String {
    let mut out = String::from(
        "| workload | figure | one node | cluster, 3 primaries | cluster / one node |\n|---|---|---:|---:|---:|\n",
    );
    // The workload is named on its first row only.
    let mut last = String::new();
    let mut row = |workload: &str, figure: &str, single: String, cluster: String, ratio: String| {
        let named = if last == workload { "" } else { workload };
        out.push_str(&format!(
            "| {named} | {figure} | {single} | {cluster} | {ratio} |\n"
        ));
        last = workload.to_owned();
    };
    let w1_label = format!("W1: {w1_pairs} pairs in sequence, one client");
    let w2_label = format!("W2: 50 tasks on one client, own names, {w2_pairs} pairs");
    for (label, pairs) in [(&w1_label, w1), (&w2_label, w2)] {
        let [single, cluster] = pairs;
        row(
            label,
            "pairs/s",
            format!("{:.0}", single.rate()),
            format!("{:.0}", cluster.rate()),
            ratio(cluster.rate(), single.rate()),
        );
        if !single.latencies.is_empty() {
            let p = |pairs: &Pairs, q: f64| percentile(&mut pairs.latencies.clone(), q);
            row(
                label,
                "pair p50 / p99",
                format!("{} / {} ms", ms3(p(single, 0.5)), ms3(p(single, 0.99))),
                format!("{} / {} ms", ms3(p(cluster, 0.5)), ms3(p(cluster, 0.99))),
                ratio(p(cluster, 0.5).as_secs_f64(), p(single, 0.5).as_secs_f64()),
            );
        }
        row(
            label,
            "**client CPU per pair**",
            us(single.client_us()),
            us(cluster.client_us()),
            format!("**{}**", ratio(cluster.client_us(), single.client_us())),
        );
        row(
            label,
            "Redis CPU per pair (all nodes)",
            us(single.redis_us()),
            us(cluster.redis_us()),
            ratio(cluster.redis_us(), single.redis_us()),
        );
        row(
            label,
            "Redis commands per pair (scripts' included)",
            format!("{:.2}", single.commands_per_pair()),
            format!("{:.2}", cluster.commands_per_pair()),
            String::new(),
        );
        row(
            label,
            "Redis socket reads per pair (all nodes)",
            format!("{:.2}", single.reads_per_pair()),
            format!("{:.2}", cluster.reads_per_pair()),
            ratio(cluster.reads_per_pair(), single.reads_per_pair()),
        );
    }
    let w3_label =
        format!("W3: {CONTENDERS} contenders (own clients), {sections} sections of ~1 ms");
    let [single, cluster] = w3;
    row(
        &w3_label,
        "sections/s",
        format!("{:.0}", single.rate),
        format!("{:.0}", cluster.rate),
        ratio(cluster.rate, single.rate),
    );
    row(
        &w3_label,
        "hand-off p50 / p99",
        format!("{} / {} ms", ms(single.handoff[0]), ms(single.handoff[1])),
        format!("{} / {} ms", ms(cluster.handoff[0]), ms(cluster.handoff[1])),
        format!(
            "{} / {}",
            ratio(
                cluster.handoff[0].as_secs_f64(),
                single.handoff[0].as_secs_f64()
            ),
            ratio(
                cluster.handoff[1].as_secs_f64(),
                single.handoff[1].as_secs_f64()
            )
        ),
    );
    row(
        &w3_label,
        "wait p50 / p99 / max",
        format!(
            "{} / {} / {} ms",
            ms(single.wait[0]),
            ms(single.wait[1]),
            ms(single.wait[2])
        ),
        format!(
            "{} / {} / {} ms",
            ms(cluster.wait[0]),
            ms(cluster.wait[1]),
            ms(cluster.wait[2])
        ),
        String::new(),
    );
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    row(
        &w3_label,
        "**client CPU per section** (sections' counter GET/SET included)",
        us(micros(single.client_cpu)),
        us(micros(cluster.client_cpu)),
        format!(
            "**{}**",
            ratio(micros(cluster.client_cpu), micros(single.client_cpu))
        ),
    );
    row(
        &w3_label,
        "Redis CPU per section (all nodes)",
        us(micros(single.redis_cpu)),
        us(micros(cluster.redis_cpu)),
        ratio(micros(cluster.redis_cpu), micros(single.redis_cpu)),
    );
    row(
        &w3_label,
        "counter (lost updates?)",
        exact(single.counter_ok).to_owned(),
        exact(cluster.counter_ok).to_owned(),
        String::new(),
    );
    let w4_label = format!(
        "W4: {} renewed locks, ttl 1 s, held {:.0} s, one client",
        w4[0].count,
        hold.as_secs_f64()
    );
    let [single, cluster] = w4;
    row(
        &w4_label,
        "**missed renewals** (late / lost)",
        format!("{} / {}", single.missed, single.lost),
        format!("{} / {}", cluster.missed, cluster.lost),
        String::new(),
    );
    row(
        &w4_label,
        "time to take the locks (64 at a time)",
        format!("{:.2} s", single.taking),
        format!("{:.2} s", cluster.taking),
        ratio(cluster.taking, single.taking),
    );
    row(
        &w4_label,
        "renewals/s",
        format!("{:.0}", single.renewals / single.elapsed),
        format!("{:.0}", cluster.renewals / cluster.elapsed),
        ratio(
            cluster.renewals / cluster.elapsed,
            single.renewals / single.elapsed,
        ),
    );
    row(
        &w4_label,
        "renewal batches / round trips (failed)",
        format!(
            "{:.0} / {:.0} ({})",
            single.batches, single.round_trips, single.failed_round_trips
        ),
        format!(
            "{:.0} / {:.0} ({})",
            cluster.batches, cluster.round_trips, cluster.failed_round_trips
        ),
        String::new(),
    );
    row(
        &w4_label,
        "renewals per script call (EVALSHA)",
        format!("{:.1}", single.renewals / single.script_calls.max(1.0)),
        format!("{:.1}", cluster.renewals / cluster.script_calls.max(1.0)),
        String::new(),
    );
    row(
        &w4_label,
        "**round trips per batch**",
        format!("{:.2}", trips_per_batch(single)),
        format!("{:.2}", trips_per_batch(cluster)),
        String::new(),
    );
    let core = |renewed: &Renewed, cpu: f64| {
        format!(
            "{:.1} % of a core ({:.2} µs per renewal)",
            100.0 * cpu / renewed.elapsed,
            1e6 * cpu / renewed.renewals.max(1.0)
        )
    };
    row(
        &w4_label,
        "**client CPU**",
        core(single, single.client_cpu),
        core(cluster, cluster.client_cpu),
        ratio(cluster.client_cpu, single.client_cpu),
    );
    row(
        &w4_label,
        "Redis CPU (all nodes)",
        core(single, single.redis_cpu),
        core(cluster, cluster.redis_cpu),
        ratio(cluster.redis_cpu, single.redis_cpu),
    );
    out
}

fn ms3(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1e3)
}

fn exact(ok: bool) -> &'static str {
    if ok {
        "exact"
    } else {
        "LOST UPDATES"
    }
}

fn trips_per_batch(renewed: &Renewed) -> f64 {
    renewed.round_trips / renewed.batches.max(1.0)
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

/// The cluster targets, each with its figures and whether it is met.
fn targets(
    w1: &[Pairs; 2],
    w2: &[Pairs; 2],
    w3: &[crate::compare::Contention; 2],
    w4: &[Renewed; 2],
) -> String {
    let mut out = String::from("| target | one node | cluster | |\n|---|---:|---:|---|\n");
    for (label, [single, cluster]) in [("W1", w1), ("W2", w2)] {
        let times = cluster.client_us() / single.client_us();
        out.push_str(&format!(
            "| {label}: client CPU per pair within {CLIENT_CPU_TARGET}× one node's | {} | {} ({times:.2}×) | {} |\n",
            us(single.client_us()),
            us(cluster.client_us()),
            met(times <= CLIENT_CPU_TARGET)
        ));
    }
    let [single, cluster] = w3;
    let times = cluster.client_cpu.as_secs_f64() / single.client_cpu.as_secs_f64();
    out.push_str(&format!(
        "| W3: client CPU per section within {CLIENT_CPU_TARGET}× one node's | {} | {} ({times:.2}×) | {} |\n",
        us(single.client_cpu.as_secs_f64() * 1e6),
        us(cluster.client_cpu.as_secs_f64() * 1e6),
        met(times <= CLIENT_CPU_TARGET)
    ));
    let tails = (0..2)
        .all(|i| cluster.handoff[i].as_secs_f64() <= TAIL_TARGET * single.handoff[i].as_secs_f64());
    out.push_str(&format!(
        "| W3: hand-off p50 and p99 as on one node (each within {TAIL_TARGET}×) | {} / {} ms | {} / {} ms | {} |\n",
        ms(single.handoff[0]),
        ms(single.handoff[1]),
        ms(cluster.handoff[0]),
        ms(cluster.handoff[1]),
        met(tails)
    ));
    let [single, cluster] = w4;
    out.push_str(&format!(
        "| W4: 0 missed renewals, every lock kept (late / lost) | {} / {} | {} / {} | {} |\n",
        single.missed,
        single.lost,
        cluster.missed,
        cluster.lost,
        met(single.kept() && cluster.kept() && single.lost == 0 && cluster.lost == 0)
    ));
    out.push_str(&format!(
        "| W4: round trips per renewal batch: 1 on one node, at most 3 (one per primary) on the cluster | {:.2} | {:.2} | {} |\n",
        trips_per_batch(single),
        trips_per_batch(cluster),
        met(trips_per_batch(single) <= 1.0 && trips_per_batch(cluster) <= 3.0)
    ));
    out
}
