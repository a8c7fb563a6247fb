//! `lock-bench redlock`: RedLock over 5 local redis-servers (issue 13), this
//! project (`redis-quorum://`) beside rslock (which takes the node URLs),
//! in one run: W1 (lock + unlock pairs in sequence, one locker) and W3
//! (8 contenders with their own clients, ~1 ms sections).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use test_support::RedisServer;

use crate::compare::w3;
use crate::implementations::{Kind, Locker};
use crate::option;
use crate::process_usage::cpu_time;
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
    let sections: usize = option(args, "--sections").map_or(500, |n| n.parse().unwrap());
    let quorum = Quorum((0..5).map(|_| RedisServer::start()).collect());
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
    println!("## RedLock over 5 local nodes (issue 13): this project beside rslock\n");
    println!(
        "One PING round trip to one node: {:.0} µs.\n",
        rtt.as_secs_f64() * 1e6
    );
    println!("| workload | implementation | pairs or sections/s | µs per pair (wall) | pair in node round trips | client CPU µs/pair | hand-off p50 / p99 | wait p50 / p99 |");
    println!("|---|---|---:|---:|---:|---:|---|---|");
    for (kind, name) in [
        (Kind::Manual, "this project"),
        (Kind::Rslock, "rslock 0.10"),
    ] {
        let (wall, cpu) = runtime.block_on(sequential(&quorum, kind, pairs));
        let per = wall / pairs as u32;
        println!(
            "| W1: {pairs} lock + unlock pairs in sequence | {name} | {:.0} | {:.0} | {:.1} | {:.1} | | |",
            pairs as f64 / wall.as_secs_f64(),
            per.as_secs_f64() * 1e6,
            per.as_secs_f64() / rtt.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / pairs as f64,
        );
    }
    for (kind, name) in [
        (Kind::ManualWait, "this project"),
        (Kind::Rslock, "rslock 0.10"),
    ] {
        let result = runtime.block_on(w3(&quorum, kind, sections, 8, false, true));
        let ms = |duration: Duration| format!("{:.2}", duration.as_secs_f64() * 1e3);
        println!(
            "| W3: 8 contenders, {sections} sections of ~1 ms | {name} | {:.0} | | | {:.1} | {} / {} ms | {} / {} ms |",
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

/// `pairs` lock + unlock pairs in sequence: wall time and client CPU.
async fn sequential(quorum: &Quorum, kind: Kind, pairs: usize) -> (Duration, Duration) {
    let mut locker = Locker::new(kind, &quorum.client_url(), "redlock-w1", false).await;
    let held = locker.lock().await;
    locker.unlock(held).await; // warm: connections, scripts
    let (started, cpu) = (Instant::now(), cpu_time());
    for _ in 0..pairs {
        let held = locker.lock().await;
        locker.unlock(held).await;
    }
    (started.elapsed(), cpu_time() - cpu)
}
