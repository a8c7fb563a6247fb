//! `lock-bench scale --processes N --tasks T [--seconds S]`: many OS
//! processes on one node and on local Redis Clusters of 3 and 6 primaries,
//! this project beside the hand-written floor in the same run.
//!
//! - **Pairs**: each of the N processes (copies of this binary, the hidden
//!   mode `scale-worker`) runs T tasks, each taking and releasing a key of
//!   its own in a loop; pairs per second, all processes together.
//! - **Hot key**: every task of every process takes one key; sections (of
//!   no work) per second. This project waits (woken by releases); the floor
//!   retries `SET NX PX` 1 ms after a busy answer.
//!
//! One client (this project) or one connection (the floor: a multiplexed
//! connection, or the `redis` crate's cluster connection) per process, as
//! an application has. Processes are started and connected first, then all
//! told to go; each counts what it finished within its `S` seconds. The
//! table says how many cores the machine has: every server, every process
//! and this one share them.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};
use test_support::{Process, RedisCluster, RedisServer};

use crate::option;
use crate::process_usage::redis_cpu;
use crate::target::Target;

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Ours,
    Floor,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Pairs,
    HotKey,
}

pub(crate) fn main(args: &[String]) -> ExitCode {
    let number = |name: &str, default: usize| {
        option(args, name).map_or(default, |value| value.parse().expect(name))
    };
    let (processes, tasks, seconds) = (
        number("--processes", 64),
        number("--tasks", 4),
        number("--seconds", 3),
    );
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("## Many processes: `lock-bench scale --processes {processes} --tasks {tasks} --seconds {seconds}`\n");
    println!(
        "{processes} OS processes × {tasks} tasks, {seconds} s per row, on a machine of **{cores} cores** \
         shared by every redis-server, every process and the harness. Pairs: each task takes and releases a key \
         of its own. Hot key: every task of every process takes one key (this project waits, woken by releases; \
         the floor retries `SET NX PX` 1 ms after a busy answer). One client (or connection) per process. \
         Redis CPU: every server's, added up, per pair or section.\n"
    );
    println!("| target | workload | this project /s | floor /s | × floor | this project Redis CPU µs | floor Redis CPU µs |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let single = RedisServer::start();
    run_target("one node", &single, processes, tasks, seconds);
    drop(single);
    for primaries in [3, 6] {
        let cluster = RedisCluster::start(primaries, 0);
        run_target(
            &format!("cluster, {primaries} primaries"),
            &cluster,
            processes,
            tasks,
            seconds,
        );
    }
    ExitCode::SUCCESS
}

fn run_target(label: &str, target: &impl Target, processes: usize, tasks: usize, seconds: usize) {
    for workload in [Workload::Pairs, Workload::HotKey] {
        let mut results = Vec::new();
        for who in [Who::Ours, Who::Floor] {
            results.push(measure(target, who, workload, processes, tasks, seconds));
        }
        let (ours, floor) = (results[0], results[1]);
        println!(
            "| {label} | {} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} |",
            match workload {
                Workload::Pairs => "pairs, own keys",
                Workload::HotKey => "hot key, sections",
            },
            ours.0,
            floor.0,
            ours.0 / floor.0,
            ours.1,
            floor.1,
        );
    }
}

/// Runs the processes of one row: (per second, Redis CPU µs per unit).
fn measure(
    target: &impl Target,
    who: Who,
    workload: Workload,
    processes: usize,
    tasks: usize,
    seconds: usize,
) -> (f64, f64) {
    let program = std::env::current_exe().expect("current_exe");
    let url = target.client_url();
    let mut children: Vec<Process> = (0..processes)
        .map(|index| {
            let args = [
                "scale-worker".to_owned(),
                format!("{who:?}"),
                format!("{workload:?}"),
                url.clone(),
                index.to_string(),
                tasks.to_string(),
                seconds.to_string(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Process::spawn(&program, &args, None)
        })
        .collect();
    for child in &mut children {
        assert_eq!(child.line(Duration::from_secs(120)), "ready");
    }
    let cpu = redis_cpu(target);
    children.iter_mut().for_each(|child| child.send("go"));
    let mut done = 0u64;
    for child in &mut children {
        let line = child.line(Duration::from_secs(seconds as u64 + 120));
        done += line
            .strip_prefix("done count=")
            .and_then(|count| count.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("a worker said {line:?}"));
        child.wait_success(Duration::from_secs(30));
    }
    let cpu = redis_cpu(target) - cpu;
    (
        done as f64 / seconds as f64,
        cpu.as_secs_f64() * 1e6 / done.max(1) as f64,
    )
}

/// The hidden worker: `scale-worker <who> <workload> <url> <index> <tasks>
/// <seconds>`. Connects, prints `ready`, waits for `go`, runs, prints
/// `done count=N`.
pub(crate) fn worker(args: &[String]) -> ExitCode {
    let [who, workload, url, index, tasks, seconds] = args else {
        eprintln!(
            "usage: lock-bench scale-worker <who> <workload> <url> <index> <tasks> <seconds>"
        );
        return ExitCode::FAILURE;
    };
    let who = if who == "Ours" { Who::Ours } else { Who::Floor };
    let workload = if workload == "Pairs" {
        Workload::Pairs
    } else {
        Workload::HotKey
    };
    let tasks: usize = tasks.parse().expect("tasks");
    let seconds = Duration::from_secs(seconds.parse().expect("seconds"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let count = Arc::new(AtomicU64::new(0));
    let floor = runtime.block_on(async {
        match who {
            Who::Ours => None,
            Who::Floor => Some(FloorConnection::open(url).await),
        }
    });
    let client = {
        let _runtime = runtime.enter();
        Client::new(Config::new(url.as_str())).expect("client")
    };
    let key = |task: usize| match workload {
        Workload::Pairs => format!("scale:{index}:{task}"),
        Workload::HotKey => "scale:hot".to_owned(),
    };
    // Warm: connections open, scripts loaded.
    runtime.block_on(async {
        match &floor {
            None => {
                let lock = Lock::new(format!("scale:warm:{index}")).client(client.clone());
                lock.acquire().await.unwrap().release().await.unwrap();
            }
            Some(floor) => floor.clone().pair(&format!("scale:warm:{index}"), 0).await,
        }
    });
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("stdin");
    let until = Instant::now() + seconds;
    runtime.block_on(async {
        let running: Vec<_> = (0..tasks)
            .map(|task| {
                let (key, count) = (key(task), Arc::clone(&count));
                let (client, floor) = (client.clone(), floor.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    match floor {
                        None => {
                            let lock = Lock::new(key)
                                .ttl(Duration::from_secs(10))
                                .wait(Duration::from_secs(60))
                                .client(client);
                            while Instant::now() < until {
                                let guard = lock.acquire().await.expect("acquire");
                                guard.release().await.expect("release");
                                n += 1;
                            }
                        }
                        Some(mut floor) => {
                            while Instant::now() < until {
                                floor.pair(&key, n).await;
                                n += 1;
                            }
                        }
                    }
                    count.fetch_add(n, Ordering::Relaxed);
                })
            })
            .collect();
        for task in running {
            task.await.expect("task");
        }
    });
    println!("done count={}", count.load(Ordering::Relaxed));
    ExitCode::SUCCESS
}

/// The floor's connection: what a user of the `redis` crate opens.
#[derive(Clone)]
enum FloorConnection {
    Node(redis::aio::MultiplexedConnection, Arc<redis::Script>),
    Cluster(redis::cluster_async::ClusterConnection, Arc<redis::Script>),
}

impl FloorConnection {
    async fn open(url: &str) -> FloorConnection {
        let script = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
        match url.strip_prefix("redis-cluster://") {
            Some(hosts) => {
                let nodes: Vec<String> = hosts
                    .split(',')
                    .map(|host| format!("redis://{host}/"))
                    .collect();
                let connection = redis::cluster::ClusterClient::builder(nodes)
                    .response_timeout(Duration::from_secs(30))
                    .build()
                    .expect("cluster client")
                    .get_async_connection()
                    .await
                    .expect("cluster connection");
                FloorConnection::Cluster(connection, script)
            }
            None => {
                let mut connection = redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connection");
                // 64 processes on 2 cores: a reply can take longer than the
                // redis crate's default 500 ms; the floor waits for it.
                connection.set_response_timeout(Duration::from_secs(30));
                FloorConnection::Node(connection, script)
            }
        }
    }

    /// Takes `key` (retrying 1 ms after a busy answer) and releases it.
    async fn pair(&mut self, key: &str, n: u64) {
        let token = format!("{:08x}{n:016x}", std::process::id());
        loop {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(&token).arg("NX").arg("PX").arg(10_000);
            let taken: Option<String> = match self {
                FloorConnection::Node(connection, _) => set.query_async(connection).await,
                FloorConnection::Cluster(connection, _) => set.query_async(connection).await,
            }
            .expect("SET");
            if taken.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let released: i64 = match self {
            FloorConnection::Node(connection, script) => {
                script.key(key).arg(&token).invoke_async(connection).await
            }
            FloorConnection::Cluster(connection, script) => {
                script.key(key).arg(&token).invoke_async(connection).await
            }
        }
        .expect("release");
        assert_eq!(released, 1);
    }
}
