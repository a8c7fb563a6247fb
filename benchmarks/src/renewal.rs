//! W4: many renewed locks held in one process.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockGuard};
use test_support::RedisServer;

use crate::option;
use crate::process_usage::{calls, cpu_time, redis_cpu, resident_bytes};
use crate::target::{node_url, Target};

pub(crate) fn main(args: &[String]) -> ExitCode {
    let counts: Vec<usize> = option(args, "--locks")
        .unwrap_or_else(|| "1000,10000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("--locks takes numbers"))
        .collect();
    let seconds: u64 = option(args, "--seconds").map_or(60, |s| s.parse().expect("--seconds"));
    let ttl = Duration::from_millis(
        option(args, "--ttl-ms").map_or(1000, |s| s.parse().expect("--ttl-ms")),
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!("renewal benchmark: ttl {ttl:?} (renewed every ttl/3), held {seconds} s per run");
    println!();
    print!("{HEADER}");
    let mut all_kept = true;
    for count in counts {
        let server = RedisServer::start();
        let (row, kept) = runtime.block_on(run(&server, count, ttl, Duration::from_secs(seconds)));
        println!("{row}");
        all_kept &= kept;
    }
    if all_kept {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The table's header, for the rows [`run`] returns.
pub(crate) const HEADER: &str = "| locks | renewals/s | round trips/s | renewals per round trip | missed renewals | lost | failed round trips | RSS per lock | client CPU | Redis CPU | other client's PING p50 / p99 / max |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";

/// Takes `count` renewed locks with one client, holds them for `hold`, and
/// returns the table row and whether every lock was kept with no renewal
/// missed.
pub(crate) async fn run(
    server: &RedisServer,
    count: usize,
    ttl: Duration,
    hold: Duration,
) -> (String, bool) {
    let held = hold_renewed(server, count, ttl, hold, true).await;
    let row = format!(
        "| {count} | {:.0} | {:.1} | {:.0} | {} | {} | {} | {:.0} B | {:.1} % of a core ({:.2} µs per renewal) | {:.1} % of a core | {} |",
        held.renewals / held.elapsed,
        held.round_trips / held.elapsed,
        held.renewals / held.round_trips.max(1.0),
        held.missed,
        held.lost,
        held.failed_round_trips,
        held.resident_per_lock,
        100.0 * held.client_cpu / held.elapsed,
        1e6 * held.client_cpu / held.renewals.max(1.0),
        100.0 * held.redis_cpu / held.elapsed,
        held.pings.as_deref().unwrap_or(""),
    );
    (row, held.kept())
}

/// What [`hold_renewed`] measured while the locks were held.
pub(crate) struct Renewed {
    pub(crate) count: usize,
    /// Seconds taken to acquire the locks (64 at a time).
    pub(crate) taking: f64,
    /// Seconds the locks were held (measured).
    pub(crate) elapsed: f64,
    /// Renewals sent while held.
    pub(crate) renewals: f64,
    /// Renewal batches (the locks due together) sent while held.
    pub(crate) batches: f64,
    /// Round trips to Redis made for them (one per primary of a batch on a
    /// cluster).
    pub(crate) round_trips: f64,
    pub(crate) failed_round_trips: u64,
    /// Script calls (EVALSHA, EVAL) Redis ran while held, every node's.
    pub(crate) script_calls: f64,
    /// Renewals confirmed after the lock's local validity ran out.
    pub(crate) missed: u64,
    /// Locks found lost by the driver, or not held at the end.
    pub(crate) lost: u64,
    /// Locks still held at the end.
    pub(crate) held: usize,
    pub(crate) resident_per_lock: f64,
    /// This process's CPU seconds while held.
    pub(crate) client_cpu: f64,
    /// Redis's CPU seconds while held (every node's).
    pub(crate) redis_cpu: f64,
    /// Another client's PING p50 / p99 / max afterwards, if probed.
    pub(crate) pings: Option<String>,
}

impl Renewed {
    /// Every lock kept, no renewal missed.
    pub(crate) fn kept(&self) -> bool {
        self.missed == 0 && self.held == self.count
    }
}

/// Takes `count` renewed locks (`bench:renewal:<n>`: spread over the slots
/// of a cluster) with one client, holds them for `hold` and measures; then,
/// if `probe`, PINGs the (first) server from another client for up to 10 s.
pub(crate) async fn hold_renewed(
    server: &impl Target,
    count: usize,
    ttl: Duration,
    hold: Duration,
    probe: bool,
) -> Renewed {
    let client = Client::new(Config::new(server.client_url())).expect("client");
    // Warm the connection so its buffers are not counted per lock.
    Lock::new("warm-up")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let resident_before = resident_bytes();
    let taking = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(count);
    let mut pending = tokio::task::JoinSet::new();
    for n in 0..count {
        let lock = Lock::new(format!("bench:renewal:{n}"))
            .ttl(ttl)
            .renew()
            .client(client.clone());
        pending.spawn(async move { lock.acquire().await });
        if pending.len() >= 64 {
            guards.push(
                pending
                    .join_next()
                    .await
                    .unwrap()
                    .unwrap()
                    .expect("acquire"),
            );
        }
    }
    while let Some(guard) = pending.join_next().await {
        guards.push(guard.unwrap().expect("acquire"));
    }
    let taking = taking.elapsed().as_secs_f64();
    let resident_held = resident_bytes();

    let stats_before = client.renewal_stats();
    let cpu_before = cpu_time();
    let redis_before = redis_cpu(server);
    let scripts_before = script_calls(server);
    let started = Instant::now();
    tokio::time::sleep(hold).await;
    let elapsed = started.elapsed().as_secs_f64();
    let stats = client.renewal_stats();
    let cpu = (cpu_time() - cpu_before).as_secs_f64();
    let redis = (redis_cpu(server) - redis_before).as_secs_f64();
    let scripts = script_calls(server) - scripts_before;
    // Then, apart from the CPU figures: another client of the same Redis,
    // pinging every 5 ms, shows what the renewals' script calls cost
    // everyone else in latency.
    let pings = if probe {
        Some(
            probe_latency(
                &node_url(server.ports()[0]),
                hold.min(Duration::from_secs(10)),
            )
            .await,
        )
    } else {
        None
    };
    let held = guards.iter().filter(|guard| guard.is_held()).count();
    let renewed = Renewed {
        count,
        taking,
        elapsed,
        renewals: (stats.renewals_sent - stats_before.renewals_sent) as f64,
        batches: (stats.batches - stats_before.batches) as f64,
        round_trips: (stats.round_trips - stats_before.round_trips) as f64,
        failed_round_trips: stats.failed_round_trips,
        script_calls: scripts as f64,
        missed: stats.late_renewals,
        lost: stats.lost + (count - held) as u64,
        held,
        resident_per_lock: (resident_held.saturating_sub(resident_before)) as f64 / count as f64,
        client_cpu: cpu,
        redis_cpu: redis,
        pings,
    };
    for guard in guards {
        let _ = guard.release().await;
    }
    renewed
}

/// Script calls (EVALSHA, EVAL) every node of `server` has run.
fn script_calls(server: &impl Target) -> u64 {
    calls(server, "evalsha") + calls(server, "eval")
}

/// PINGs Redis every 5 ms for `period` on a connection of its own; returns
/// "p50 / p99 / max" of the round trips.
async fn probe_latency(url: &str, period: Duration) -> String {
    let mut connection = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("probe connection");
    let mut samples = Vec::new();
    let until = Instant::now() + period;
    while Instant::now() < until {
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .expect("PING");
        samples.push(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    format!(
        "{:.2} / {:.2} / {:.2} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3
    )
}
