//! `lock-bench multi`: a 2-key set (`Lock::all`, one script on one server)
//! beside two single locks taken one after the other, uncontended: pairs
//! (both keys taken and released) per second, and the Redis commands each
//! pair costs.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use test_support::RedisServer;

use crate::option;

pub(crate) fn main(args: &[String]) -> ExitCode {
    let seconds: f64 = option(args, "--seconds").map_or(3.0, |seconds| seconds.parse().unwrap());
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("## Several keys at once: a 2-key set beside two single locks in sequence, one server on loopback, uncontended\n");
    println!("| way | pairs/s | EVALSHA per pair | plain SET per pair | Redis commands per pair (those scripts run included) |");
    println!("|---|---:|---:|---:|---:|");
    // Interleaved rounds so that drift hits both alike.
    let rounds = 6;
    let mut totals = [(0u64, Duration::ZERO, [0u64; 3]); 2];
    for _ in 0..rounds {
        for (way, set) in [true, false].into_iter().enumerate() {
            let (pairs, took, counts) = runtime.block_on(pairs(
                &server,
                set,
                Duration::from_secs_f64(seconds / f64::from(rounds) / 2.0),
            ));
            let total = &mut totals[way];
            total.0 += pairs;
            total.1 += took;
            for (sum, count) in total.2.iter_mut().zip(counts) {
                *sum += count;
            }
        }
    }
    for (way, name) in [
        "`Lock::all([a, b])` (acquire_all.lua)",
        "`Lock::new(a)` then `Lock::new(b)`",
    ]
    .into_iter()
    .enumerate()
    {
        let (pairs, took, [evalsha, plain_set, commands]) = totals[way];
        let per = |count: u64| count as f64 / pairs as f64;
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.2} |",
            pairs as f64 / took.as_secs_f64(),
            per(evalsha),
            per(plain_set),
            per(commands),
        );
    }
    ExitCode::SUCCESS
}

/// Pairs for `length`: how many, how long, and the commands Redis ran
/// (EVALSHA, plain SET sent by the client, every command).
async fn pairs(server: &RedisServer, set: bool, length: Duration) -> (u64, Duration, [u64; 3]) {
    let client = Client::new(Config::new(server.url())).unwrap();
    let both = Lock::all(["bench:a", "bench:b"]).client(client.clone());
    let (a, b) = (
        Lock::new("bench:a").client(client.clone()),
        Lock::new("bench:b").client(client),
    );
    // Warm up: connection, scripts.
    both.try_acquire().await.unwrap().release().await.unwrap();
    a.try_acquire().await.unwrap().release().await.unwrap();
    let before = stats(server);
    let started = Instant::now();
    let mut count = 0;
    while started.elapsed() < length {
        if set {
            both.try_acquire().await.unwrap().release().await.unwrap();
        } else {
            let first = a.try_acquire().await.unwrap();
            let second = b.try_acquire().await.unwrap();
            first.release().await.unwrap();
            second.release().await.unwrap();
        }
        count += 1;
    }
    let took = started.elapsed();
    let after = stats(server);
    // The set's SETs run inside its script; the singles' are sent plain.
    let sets = after[1] - before[1];
    let plain = if set { 0 } else { sets };
    // Less the INFO calls themselves.
    (
        count,
        took,
        [after[0] - before[0], plain, after[2] - before[2] - 2],
    )
}

/// EVALSHA calls, SET calls and every command processed so far.
fn stats(server: &RedisServer) -> [u64; 3] {
    let commands = server.command(&["INFO", "commandstats"]).unwrap();
    let calls = |name: &str| {
        let prefix = format!("cmdstat_{name}:calls=");
        commands
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().unwrap())
    };
    let stats = server.command(&["INFO", "stats"]).unwrap();
    let total = stats
        .lines()
        .find_map(|line| line.strip_prefix("total_commands_processed:"))
        .map_or(0, |total| total.trim().parse().unwrap());
    [calls("evalsha"), calls("set"), total]
}
