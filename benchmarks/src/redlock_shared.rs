//! `lock-bench redlock-shared`: uncontended W1 (acquire + release pairs in
//! sequence, one task, manual API) over a quorum of 3 and of 5 local nodes
//! for the exclusive `Lock`, `RwLock` write and read, and a `Semaphore` of
//! 4 taking 1: pairs/s, each beside the exclusive lock, and client CPU per
//! pair (issue 29).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, RwLock, Semaphore};
use test_support::RedisServer;

use crate::option;
use crate::process_usage::cpu_time;
use crate::redlock::Quorum;
use crate::target::Target;

const TTL: Duration = Duration::from_secs(10);

pub(crate) fn main(args: &[String]) -> ExitCode {
    let pairs: usize = option(args, "--pairs").map_or(2000, |pairs| pairs.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("## Shared kinds over a quorum (issue 29): W1, {pairs} pairs in sequence\n");
    println!("| nodes | primitive | pairs/s | × exclusive | client CPU µs/pair |");
    println!("|---:|---|---:|---:|---:|");
    for nodes in [3usize, 5] {
        let quorum = Quorum((0..nodes).map(|_| RedisServer::start()).collect());
        let client = runtime
            .block_on(async { Client::new(Config::new(quorum.client_url())) })
            .expect("client");
        let mut exclusive = None;
        for (name, lock) in [
            ("Lock (exclusive)", Lock::new("w1")),
            ("RwLock write", RwLock::new("w1").write()),
            ("RwLock read", RwLock::new("w1").read()),
            ("Semaphore(4).take(1)", Semaphore::new("w1", 4).take(1)),
        ] {
            let lock = lock.ttl(TTL).client(client.clone());
            let (wall, cpu) = runtime.block_on(async {
                // Warm: connections, scripts.
                lock.try_acquire().await.unwrap().release().await.unwrap();
                let (started, cpu) = (Instant::now(), cpu_time());
                for _ in 0..pairs {
                    lock.try_acquire().await.unwrap().release().await.unwrap();
                }
                (started.elapsed(), cpu_time() - cpu)
            });
            let rate = pairs as f64 / wall.as_secs_f64();
            let base = *exclusive.get_or_insert(rate);
            println!(
                "| {nodes} | {name} | {rate:.0} | {:.2} | {:.1} |",
                rate / base,
                cpu.as_secs_f64() * 1e6 / pairs as f64
            );
        }
    }
    ExitCode::SUCCESS
}
