//! `lock-bench sentinel`: W1 (uncontended lock + unlock pairs in sequence,
//! one client) through Redis Sentinel (`redis-sentinel://`, test-support's
//! primary, two replicas and three sentinels on loopback) beside a direct
//! connection to the same primary, in interleaved rounds, and their ratio.
//! Once the primary is known, a call through Sentinel is one round trip to
//! it, as a direct call is: the ratio shows what the epoch check costs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use test_support::RedisSentinel;

use crate::option;

pub(crate) fn main(args: &[String]) -> ExitCode {
    let pairs: usize = option(args, "--pairs").map_or(20_000, |pairs| pairs.parse().unwrap());
    let rounds: usize = option(args, "--rounds").map_or(20, |rounds| rounds.parse().unwrap());
    let setup = RedisSentinel::start();
    let primary = setup.primary().expect("one primary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Clients are made on the runtime they run on.
    let _entered = runtime.enter();
    let direct = Client::new(Config::new(format!("redis://127.0.0.1:{primary}/"))).unwrap();
    let sentinel = Client::new(Config::new(setup.url(""))).unwrap();
    println!(
        "## W1 through Redis Sentinel beside a direct connection to the same primary \
         ({pairs} pairs each, {rounds} interleaved rounds)\n"
    );
    let mut totals = [Duration::ZERO; 2];
    runtime.block_on(async {
        // Warm up: connections, scripts, the primary looked up.
        for client in [&direct, &sentinel] {
            w1(client, 100).await;
        }
        for _ in 0..rounds {
            for (total, client) in totals.iter_mut().zip([&direct, &sentinel]) {
                *total += w1(client, pairs / rounds).await;
            }
        }
    });
    let per = |total: Duration| total.as_secs_f64() * 1e6 / (pairs / rounds * rounds) as f64;
    println!("| connection | µs per pair | pairs/s |");
    println!("|---|---:|---:|");
    for (name, total) in ["direct (redis://)", "through Sentinel (redis-sentinel://)"]
        .into_iter()
        .zip(totals)
    {
        println!("| {name} | {:.1} | {:.0} |", per(total), 1e6 / per(total));
    }
    println!(
        "\nSentinel / direct time per pair: {:.3}",
        per(totals[1]) / per(totals[0])
    );
    ExitCode::SUCCESS
}

/// `pairs` lock + unlock pairs in sequence on `client`: the time taken.
async fn w1(client: &Client, pairs: usize) -> Duration {
    let lock = Lock::new("sentinel-bench").client(client.clone());
    let started = Instant::now();
    for _ in 0..pairs {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    started.elapsed()
}
