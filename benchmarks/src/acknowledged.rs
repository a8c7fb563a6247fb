//! `lock-bench acknowledged`: what acknowledged mode (`Config::acknowledged`:
//! `WAIT` for replicas in the same round trip as each acquisition and
//! renewal) costs, on a primary with one replica on loopback, beside the
//! same work without it, in one run.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use test_support::RedisServer;

use crate::option;
use crate::process_usage::{cpu_time, redis_cpu};

pub(crate) fn main(args: &[String]) -> ExitCode {
    let pairs: usize = option(args, "--pairs").map_or(5000, |pairs| pairs.parse().unwrap());
    let renewed: usize = option(args, "--renewed").map_or(1000, |locks| locks.parse().unwrap());
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(
        test_support::free_port().unwrap(),
        &[
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            primary.port().to_string(),
        ],
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !replica
        .command(&["INFO", "replication"])
        .unwrap_or_default()
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(20));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("## Acknowledged mode (WAIT 1 replica) beside the default, primary + 1 replica on loopback\n");
    println!("| workload | mode | µs per pair (latency) | client CPU µs/pair | primary CPU µs/pair | replica CPU µs/pair |");
    println!("|---|---|---:|---:|---:|---:|");
    // Interleaved rounds so that drift hits both modes alike.
    let mut totals = [[Duration::ZERO; 4]; 2];
    let rounds = 10;
    for _ in 0..rounds {
        for (mode, acked) in [false, true].into_iter().enumerate() {
            let figures = runtime.block_on(sequential(&primary, &replica, acked, pairs / rounds));
            for (total, figure) in totals[mode].iter_mut().zip(figures) {
                *total += figure;
            }
        }
    }
    for (mode, name) in ["default", "acknowledged"].into_iter().enumerate() {
        let per = |total: Duration| total.as_secs_f64() * 1e6 / pairs as f64;
        let [wall, client, primary_cpu, replica_cpu] = totals[mode];
        println!(
            "| W1: {pairs} lock + unlock pairs in sequence | {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
            per(wall),
            per(client),
            per(primary_cpu),
            per(replica_cpu)
        );
    }
    for (name, acked) in [("default", false), ("acknowledged", true)] {
        let (rounds, failed, lost) = runtime.block_on(renewals(&primary, acked, renewed));
        println!(
            "| {renewed} renewed locks (ttl 1 s) held 5 s | {name} | - | {rounds} renewal round trips, {failed} failed, {lost} lost | | |"
        );
    }
    ExitCode::SUCCESS
}

fn client(server: &RedisServer, acked: bool) -> Client {
    let config = Config::new(server.url());
    let config = if acked {
        config.acknowledged(1, Duration::from_millis(100))
    } else {
        config
    };
    Client::new(config).unwrap()
}

/// `pairs` lock + unlock pairs in sequence: wall time, client CPU, primary
/// and replica CPU.
async fn sequential(
    primary: &RedisServer,
    replica: &RedisServer,
    acked: bool,
    pairs: usize,
) -> [Duration; 4] {
    let client = client(primary, acked);
    let lock = Lock::new("acknowledged-bench").client(client);
    // Warm up: connection, scripts.
    lock.try_acquire().await.unwrap().release().await.unwrap();
    let (cpu, primary_cpu, replica_cpu) = (cpu_time(), redis_cpu(primary), redis_cpu(replica));
    let started = Instant::now();
    for _ in 0..pairs {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    [
        started.elapsed(),
        cpu_time() - cpu,
        redis_cpu(primary) - primary_cpu,
        redis_cpu(replica) - replica_cpu,
    ]
}

/// `locks` renewed locks held 5 s: renewal round trips, failed ones, lost
/// locks.
async fn renewals(primary: &RedisServer, acked: bool, locks: usize) -> (u64, u64, u64) {
    let client = client(primary, acked);
    let mut guards = Vec::with_capacity(locks);
    for i in 0..locks {
        let guard = Lock::new(format!("acknowledged-renewed:{i}"))
            .ttl(Duration::from_secs(1))
            .renew()
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    let before = client.renewal_stats();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = client.renewal_stats();
    for guard in guards {
        guard.release().await.unwrap();
    }
    (
        after.round_trips - before.round_trips,
        after.failed_round_trips - before.failed_round_trips,
        after.lost - before.lost,
    )
}
