//! W3: contended hand-off. Several contenders (each its own client, like
//! separate service instances) take turns on one key, each holding it about
//! 1 ms while doing a non-atomic GET / +1 / SET on a counter.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use redis::AsyncCommands;
use test_support::RedisServer;

use crate::option;
use crate::process_usage::redis_cpu;

struct Shared {
    claimed: AtomicUsize,
    last_release: Mutex<Option<Instant>>,
    waits: Mutex<Vec<Duration>>,
    handoffs: Mutex<Vec<Duration>>,
    holds: Mutex<Vec<Duration>>,
}

pub(crate) fn main(args: &[String]) -> ExitCode {
    let contenders: usize =
        option(args, "--contenders").map_or(8, |n| n.parse().expect("--contenders"));
    let sections: usize =
        option(args, "--sections").map_or(2000, |n| n.parse().expect("--sections"));
    let hold = Duration::from_millis(
        option(args, "--hold-ms").map_or(1, |n| n.parse().expect("--hold-ms")),
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!("contended hand-off: {contenders} contenders (one client each), {sections} sections of ~{hold:?}");
    println!();
    println!("| mode | sections/s | bound 1/(hold + 2 PING) | ratio | ratio to 1/(hold + uncontended pair) | wait p50 / p99 / max | hand-off p50 / p99 | busiest contender | Redis CPU per section (uncontended pair) | counter |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ok = true;
    for fair in [false, true] {
        let server = RedisServer::start();
        ok &= runtime.block_on(run(&server, contenders, sections, hold, fair));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e3)
}

/// Redis CPU of one uncontended lock + unlock pair, the pair's latency
/// (two round trips through the lock's client) and a PING round trip.
async fn baseline(server: &RedisServer) -> (Duration, Duration, Duration) {
    let client = Client::new(Config::new(server.url())).unwrap();
    let lock = Lock::new("baseline").client(client.clone());
    lock.try_acquire().await.unwrap().release().await.unwrap();
    let pairs = 2000;
    let before = redis_cpu(server);
    let mut latencies = Vec::with_capacity(pairs as usize);
    for _ in 0..pairs {
        let started = Instant::now();
        lock.try_acquire().await.unwrap().release().await.unwrap();
        latencies.push(started.elapsed());
    }
    let cpu = (redis_cpu(server) - before) / pairs;
    let pair = percentile(&mut latencies, 0.5);
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut rtts = Vec::new();
    for _ in 0..500 {
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .unwrap();
        rtts.push(sent.elapsed());
    }
    (cpu, pair, percentile(&mut rtts, 0.5))
}

async fn run(
    server: &RedisServer,
    contenders: usize,
    sections: usize,
    hold: Duration,
    fair: bool,
) -> bool {
    let (pair_cpu, pair, rtt) = baseline(server).await;
    let shared = Arc::new(Shared {
        claimed: AtomicUsize::new(0),
        last_release: Mutex::new(None),
        waits: Mutex::new(Vec::new()),
        handoffs: Mutex::new(Vec::new()),
        holds: Mutex::new(Vec::new()),
    });
    let cpu_before = redis_cpu(server);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..contenders {
        let client = Client::new(Config::new(server.url())).unwrap();
        let mut counter = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let shared = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move {
            let mut lock = Lock::new("contended")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(60))
                .client(client);
            if fair {
                lock = lock.fair();
            }
            let mut mine = 0usize;
            while shared.claimed.fetch_add(1, Ordering::SeqCst) < sections {
                let requested = Instant::now();
                let guard = lock.acquire().await.expect("acquire");
                let acquired = Instant::now();
                if let Some(released) = *shared.last_release.lock().unwrap() {
                    shared
                        .handoffs
                        .lock()
                        .unwrap()
                        .push(acquired.saturating_duration_since(released));
                }
                shared.waits.lock().unwrap().push(acquired - requested);
                let value: i64 = counter
                    .get::<_, Option<i64>>("counter")
                    .await
                    .unwrap()
                    .unwrap_or(0);
                // Tokio's timer rounds up to whole milliseconds; a thread
                // sleep holds the lock for the hold asked, not twice that.
                let rest = hold.saturating_sub(acquired.elapsed());
                tokio::task::spawn_blocking(move || std::thread::sleep(rest))
                    .await
                    .unwrap();
                let _: () = counter.set("counter", value + 1).await.unwrap();
                shared.holds.lock().unwrap().push(acquired.elapsed());
                *shared.last_release.lock().unwrap() = Some(Instant::now());
                guard.release().await.expect("release");
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
    let cpu = (redis_cpu(server) - cpu_before).as_secs_f64() / sections as f64;
    let counter: i64 = value(server, "counter");

    let mut waits = shared.waits.lock().unwrap().clone();
    let mut handoffs = shared.handoffs.lock().unwrap().clone();
    let holds = shared.holds.lock().unwrap().clone();
    let mean_hold = holds.iter().sum::<Duration>() / holds.len() as u32;
    let bound = 1.0 / (mean_hold + rtt * 2).as_secs_f64();
    let client_bound = 1.0 / (mean_hold + pair).as_secs_f64();
    let rate = sections as f64 / elapsed;
    let busiest = *per_contender.iter().max().unwrap() as f64 / sections as f64;
    println!(
        "| {} | {:.0} | {:.0} (hold {} ms, PING {} ms) | {:.2} | {:.2} (pair {} ms) | {} / {} / {} ms | {} / {} ms | {:.1} % | {:.1} µs ({:.1} µs, ×{:.2}) | {} |",
        if fair { "fair" } else { "default" },
        rate,
        bound,
        ms(mean_hold),
        ms(rtt),
        rate / bound,
        rate / client_bound,
        ms(pair),
        ms(percentile(&mut waits, 0.5)),
        ms(percentile(&mut waits, 0.99)),
        ms(percentile(&mut waits, 1.0)),
        ms(percentile(&mut handoffs, 0.5)),
        ms(percentile(&mut handoffs, 0.99)),
        100.0 * busiest,
        cpu * 1e6,
        pair_cpu.as_secs_f64() * 1e6,
        cpu / pair_cpu.as_secs_f64(),
        if counter == sections as i64 { format!("{counter} ✓") } else { format!("{counter} ✗") },
    );
    counter == sections as i64
}

fn value(server: &RedisServer, key: &str) -> i64 {
    let reply = server.command(&["GET", key]).unwrap();
    reply
        .split("\r\n")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
