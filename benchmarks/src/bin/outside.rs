//! `outside`: W2 (many keys, 50 tasks on one client) measured the way an
//! application would, with nothing of lock-bench's harness: this project
//! through its public API only, beside the floor a user of the `redis`
//! crate writes (one multiplexed connection, `SET NX PX`, a
//! compare-and-delete `redis::Script`). The two alternate in `--rounds`
//! rounds (9 by default, the order swapped each round); the figures are the
//! medians of the rounds' ratios.
//!
//! ```text
//! cargo run --release -p lock-bench --bin outside -- [--pairs 50000] [--rounds 9] [--url redis://...]
//!     [--tracing info]    an application's fmt subscriber at that level (from INFO on, the
//!                         lock's `lock.acquire` and `lock.release` spans are enabled)
//!     [--threads N]       the runtime's worker threads (default: one per core)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use redis::aio::MultiplexedConnection;

const TASKS: usize = 50;

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

fn option(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[path = "../cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_time;

/// The floor: each task a clone of one multiplexed connection.
async fn floor(connection: &MultiplexedConnection, script: &Arc<redis::Script>, per_task: usize) {
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (mut connection, script) = (connection.clone(), Arc::clone(script));
            tokio::spawn(async move {
                let key = format!("outside:floor:{task}");
                for pair in 0..per_task {
                    let token = format!("{:016x}{task:04x}{pair:012x}", std::process::id());
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut connection)
                        .await
                        .expect("SET");
                    assert!(set.is_some(), "the floor's own key was busy");
                    let released: i64 = script
                        .key(&key)
                        .arg(&token)
                        .invoke_async(&mut connection)
                        .await
                        .expect("release");
                    assert_eq!(released, 1);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// This project: each task a `Lock` of its own key on the shared client.
async fn ours(client: &Client, per_task: usize) {
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let lock = Lock::new(format!("outside:ours:{task}"))
                .ttl(Duration::from_secs(10))
                .client(client.clone());
            tokio::spawn(async move {
                for _ in 0..per_task {
                    lock.try_acquire()
                        .await
                        .expect("acquire")
                        .release()
                        .await
                        .expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pairs: usize = option(&args, "--pairs").map_or(50_000, |n| n.parse().expect("--pairs"));
    let rounds: usize = option(&args, "--rounds").map_or(9, |n| n.parse().expect("--rounds"));
    let server = option(&args, "--url")
        .is_none()
        .then(test_support::RedisServer::start);
    let url = option(&args, "--url").unwrap_or_else(|| server.as_ref().unwrap().url());
    if let Some(level) = option(&args, "--tracing") {
        tracing_subscriber::fmt()
            .with_max_level(level.parse::<tracing::Level>().expect("--tracing"))
            .init();
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = option(&args, "--threads") {
        runtime.worker_threads(threads.parse().expect("--threads"));
    }
    let runtime = runtime.enable_all().build().unwrap();
    let per_task = pairs / rounds / TASKS;
    let (connection, script, client) = runtime.block_on(async {
        let mut connection = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // The redis crate's default response timeout (500 ms) failed a run
        // on a loaded machine ("SET: timed out"); the floor waits instead.
        connection.set_response_timeout(Duration::from_secs(30));
        let script = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
        let client = Client::new(Config::new(url.as_str())).unwrap();
        // Warm: connections open, scripts loaded.
        floor(&connection, &script, 2).await;
        ours(&client, 2).await;
        (connection, script, client)
    });
    let (mut rates, mut cpus) = (Vec::new(), Vec::new());
    let (mut floor_total, mut ours_total) = (
        (Duration::ZERO, Duration::ZERO),
        (Duration::ZERO, Duration::ZERO),
    );
    for round in 0..rounds {
        let measure = |which: bool| {
            let (started, cpu) = (Instant::now(), cpu_time());
            runtime.block_on(async {
                if which {
                    ours(&client, per_task).await;
                } else {
                    floor(&connection, &script, per_task).await;
                }
            });
            (started.elapsed(), cpu_time() - cpu)
        };
        // The order alternates, so that neither always runs first.
        let (floor_run, ours_run) = if round % 2 == 0 {
            let floor_run = measure(false);
            (floor_run, measure(true))
        } else {
            let ours_run = measure(true);
            (measure(false), ours_run)
        };
        rates.push(floor_run.0.as_secs_f64() / ours_run.0.as_secs_f64());
        cpus.push(ours_run.1.as_secs_f64() / floor_run.1.as_secs_f64());
        floor_total = (floor_total.0 + floor_run.0, floor_total.1 + floor_run.1);
        ours_total = (ours_total.0 + ours_run.0, ours_total.1 + ours_run.1);
    }
    let done = (per_task * TASKS * rounds) as f64;
    let per_pair = |total: Duration| total.as_secs_f64() * 1e6 / done;
    let (low, high) = (
        rates.iter().copied().fold(f64::INFINITY, f64::min),
        rates.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "W2 outside lock-bench: {TASKS} tasks, {} pairs each, {rounds} rounds{}",
        per_task * rounds,
        option(&args, "--tracing")
            .map_or_else(String::new, |level| format!(", fmt subscriber at {level}"))
    );
    println!(
        "floor: {:.0} pairs/s, client CPU {:.1} µs/pair; this project: {:.0} pairs/s, client CPU {:.1} µs/pair",
        done / floor_total.0.as_secs_f64(),
        per_pair(floor_total.1),
        done / ours_total.0.as_secs_f64(),
        per_pair(ours_total.1),
    );
    println!(
        "this project × floor, median of {rounds} rounds: pairs/s {:.2} (range {low:.2}-{high:.2}), client CPU per pair {:.2}",
        median(&mut rates),
        median(&mut cpus),
    );
}
