//! `lock-bench redlock-degraded`: RedLock contention when only a bare
//! majority of the nodes answers. Each scenario runs on fresh local
//! redis-servers: 5 nodes all up, 2 of them stopped (SIGSTOP: they accept
//! connections and never answer), 2 killed; 3 nodes all up, 1 stopped.
//! In each, this project (manual API, waiting) and then rslock run
//! `--processes` copies of this binary (`redlock-contender`, hidden), each
//! with `--tasks` tasks taking the lock for `--seconds`. A section is a
//! non-atomic GET / +1 / SET of a counter on a separate bookkeeping server,
//! then the bookkeeping server's TIME pushed to `<counter>:ends`: lost
//! updates show in the counter, stalls in the gaps between the ends.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Commands};
use test_support::{Process, RedisServer};

use crate::compare::{ms, ping_rtt};
use crate::implementations::{Kind, Locker};
use crate::option;
use crate::redlock::Quorum;
use crate::target::Target;

/// The implementations compared, in the order they run in each scenario.
const KINDS: [Kind; 3] = [Kind::ManualWait, Kind::ManualWaitShared, Kind::Rslock];
/// How long this project waits for the lock per acquisition.
const WAIT: Duration = Duration::from_secs(5);
/// A contender's pause after a failed call, so that a failing lock does
/// not spin.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(10);

/// The nodes that do not answer, the first ones of the URL.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Down {
    None,
    Stopped(usize),
    Killed(usize),
}

const SCENARIOS: [(usize, Down); 5] = [
    (5, Down::None),
    (5, Down::Stopped(2)),
    (5, Down::Killed(2)),
    (3, Down::None),
    (3, Down::Stopped(1)),
];

/// The nodes that answer, by port.
struct Live(Vec<u16>);

impl Target for Live {
    fn client_url(&self) -> String {
        String::new()
    }

    fn ports(&self) -> Vec<u16> {
        self.0.clone()
    }

    fn port_of(&self, _key: &str) -> u16 {
        self.0[0]
    }
}

impl Down {
    /// How many nodes do not answer.
    fn count(self) -> usize {
        match self {
            Down::None => 0,
            Down::Stopped(n) | Down::Killed(n) => n,
        }
    }

    fn label(self) -> String {
        match self {
            Down::None => "none".to_owned(),
            Down::Stopped(n) => format!("{n} stopped"),
            Down::Killed(n) => format!("{n} killed"),
        }
    }
}

/// One run of one implementation in one scenario.
struct Outcome {
    nodes: usize,
    down: Down,
    kind: Kind,
    rate: f64,
    longest_gap: Duration,
    failures: u64,
    counter_exact: bool,
    /// Redis commands (those scripts ran included) and Redis CPU (µs) per
    /// section, every answering node's.
    commands: f64,
    redis_cpu: f64,
    /// Per command: calls and command µs per section (INFO commandstats).
    breakdown: Vec<(String, f64, f64)>,
}

pub(crate) fn main(args: &[String]) -> ExitCode {
    let number = |name: &str, default: u64| {
        option(args, name).map_or(default, |value| value.parse().expect(name))
    };
    let (seconds, processes, tasks) = (
        number("--seconds", 5),
        number("--processes", 3),
        number("--tasks", 3),
    );
    let bookkeeping = RedisServer::start();
    let mut outcomes = Vec::new();
    for (scenario, (nodes, down)) in SCENARIOS.into_iter().enumerate() {
        let mut quorum = Quorum((0..nodes).map(|_| RedisServer::start()).collect());
        match down {
            Down::None => {}
            Down::Stopped(n) => quorum.0[..n]
                .iter()
                .for_each(|node| signal(node, libc::SIGSTOP)),
            Down::Killed(n) => quorum.0[..n].iter_mut().for_each(RedisServer::kill),
        }
        for kind in KINDS {
            let key = format!("degraded:{scenario}:{kind:?}");
            let run = Run {
                kind,
                quorum_url: quorum.client_url(),
                bookkeeping: &bookkeeping,
                key: &key,
                processes,
                tasks,
                seconds,
            };
            // Every answering node's commands and CPU over the run (the
            // stopped and killed nodes, the first ones, answer no INFO).
            let live = Live(quorum.ports()[down.count()..].to_vec());
            let (commands, cpu, stats) = (
                crate::compare::commands(&live),
                crate::process_usage::redis_cpu(&live),
                crate::compare::command_stats(&live),
            );
            let mut outcome = run.measure(nodes, down);
            let sections = (outcome.rate * seconds as f64).max(1.0);
            outcome.commands = (crate::compare::commands(&live) - commands) as f64 / sections;
            outcome.redis_cpu =
                (crate::process_usage::redis_cpu(&live) - cpu).as_secs_f64() * 1e6 / sections;
            outcome.breakdown = crate::compare::command_breakdown(
                &stats,
                &crate::compare::command_stats(&live),
                sections,
            );
            outcomes.push(outcome);
        }
        if let Down::Stopped(n) = down {
            quorum.0[..n]
                .iter()
                .for_each(|node| signal(node, libc::SIGCONT));
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let rtt = runtime.block_on(ping_rtt(&bookkeeping, Duration::ZERO));
    print_table(&outcomes, processes, tasks, seconds, rtt);
    ExitCode::SUCCESS
}

/// Sends `signal` to a node's redis-server.
fn signal(node: &RedisServer, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(node.pid()).expect("pid fits pid_t");
    // SAFETY: kill(2) on a server this process started; no memory is involved.
    let result = unsafe { libc::kill(pid, signal) };
    assert_eq!(result, 0, "kill({pid}, {signal}) failed");
}

/// The contenders of one implementation in one scenario.
struct Run<'a> {
    kind: Kind,
    quorum_url: String,
    bookkeeping: &'a RedisServer,
    key: &'a str,
    processes: u64,
    tasks: u64,
    seconds: u64,
}

impl Run<'_> {
    /// Starts the contender processes together, waits for them, and reads
    /// the bookkeeping server.
    fn measure(&self, nodes: usize, down: Down) -> Outcome {
        let program = std::env::current_exe().expect("current_exe");
        let args = [
            "redlock-contender".to_owned(),
            format!("{:?}", self.kind),
            self.quorum_url.clone(),
            self.bookkeeping.url(),
            self.key.to_owned(),
            self.tasks.to_string(),
            self.seconds.to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut children: Vec<Process> = (0..self.processes)
            .map(|_| Process::spawn(&program, &args, None))
            .collect();
        for child in &mut children {
            assert_eq!(child.line(Duration::from_secs(30)), "ready");
        }
        children.iter_mut().for_each(|child| child.send("go"));
        let (mut sections, mut failures) = (0, 0);
        // rslock retries until it has the lock: give the last calls time.
        let patience = Duration::from_secs(self.seconds + 120);
        for child in &mut children {
            let line = child.line(patience);
            let field = |name: &str| -> u64 {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .and_then(|value| value.parse().ok())
                    .unwrap_or_else(|| panic!("a contender said {line:?}"))
            };
            sections += field("sections=");
            failures += field("failures=");
            child.wait_success(Duration::from_secs(10));
        }
        let mut connection = redis::Client::open(self.bookkeeping.url())
            .and_then(|client| client.get_connection())
            .expect("bookkeeping connection");
        let counter_key = format!("{}:counter", self.key);
        let counter: Option<u64> = connection.get(&counter_key).expect("GET counter");
        let mut ends: Vec<u64> = connection
            .lrange(format!("{counter_key}:ends"), 0, -1)
            .expect("LRANGE ends");
        ends.sort_unstable();
        let span = match (ends.first(), ends.last()) {
            (Some(first), Some(last)) => Duration::from_micros(last - first),
            _ => Duration::ZERO,
        };
        let longest_gap = ends
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .map_or(Duration::ZERO, Duration::from_micros);
        Outcome {
            nodes,
            down,
            kind: self.kind,
            rate: ends.len().saturating_sub(1) as f64 / span.as_secs_f64(),
            longest_gap,
            failures,
            counter_exact: counter.unwrap_or(0) == sections,
            commands: 0.0,
            redis_cpu: 0.0,
            breakdown: Vec::new(),
        }
    }
}

/// The hidden child mode: `redlock-contender <kind> <quorum-url>
/// <bookkeeping-url> <key> <tasks> <seconds>`. Prints `ready`, waits for
/// `go` on stdin, runs the tasks, prints `done sections=N failures=F`.
pub(crate) fn contender(args: &[String]) -> ExitCode {
    let [kind, quorum_url, bookkeeping_url, key, tasks, seconds] = args else {
        eprintln!("usage: lock-bench redlock-contender <kind> <quorum-url> <bookkeeping-url> <key> <tasks> <seconds>");
        return ExitCode::FAILURE;
    };
    let kind = *KINDS
        .iter()
        .find(|known| format!("{known:?}") == *kind)
        .unwrap_or_else(|| panic!("unknown kind {kind}"));
    let tasks: usize = tasks.parse().expect("tasks");
    let seconds = Duration::from_secs(seconds.parse().expect("seconds"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Clients and connections are made before the start.
    let contenders = runtime.block_on(async {
        let mut contenders = Vec::new();
        // One client for every task of the process, or one each.
        let shared = (kind == Kind::ManualWaitShared).then(|| {
            lock_runtime::Client::new(lock_runtime::Config::new(quorum_url.as_str()))
                .expect("client")
        });
        for _ in 0..tasks {
            let mut locker = Locker::new(kind, quorum_url, key, true).await;
            if let (Locker::Ours { client, .. }, Some(shared)) = (&mut locker, &shared) {
                *client = shared.clone();
            }
            // Our client's connections are opened lazily, and a node it has
            // not heard from yet gets a patience of its own (a new client
            // may still be connecting): one lock on another key first, as a
            // service's client that has been running a while.
            if let Locker::Ours { client, .. } = &locker {
                let warm = format!("{key}:warm:{}:{}", std::process::id(), contenders.len());
                lock_runtime::Lock::new(warm)
                    .client(client.clone())
                    .try_acquire()
                    .await
                    .expect("a free lock")
                    .release()
                    .await
                    .expect("released");
            }
            let mut bookkeeping = redis::Client::open(bookkeeping_url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .expect("bookkeeping connection");
            // The harness's own calls wait as long as they need: the redis
            // crate's default (500 ms) failed a run on a loaded machine
            // ("RPUSH: timed out"), and a slow section shows as a gap anyway.
            bookkeeping.set_response_timeout(Duration::from_secs(30));
            contenders.push((locker, bookkeeping));
        }
        contenders
    });
    println!("ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("stdin");
    let until = Instant::now() + seconds;
    let counter_key = format!("{key}:counter");
    let (sections, failures) = runtime.block_on(async {
        let running: Vec<_> = contenders
            .into_iter()
            .map(|(locker, bookkeeping)| {
                tokio::spawn(contend(locker, bookkeeping, counter_key.clone(), until))
            })
            .collect();
        let (mut sections, mut failures) = (0, 0);
        for task in running {
            let (done, failed) = task.await.expect("contender task");
            sections += done;
            failures += failed;
        }
        (sections, failures)
    });
    println!("done sections={sections} failures={failures}");
    ExitCode::SUCCESS
}

/// One task: lock, section, unlock until `until`. Returns the sections done
/// and the failed lock and unlock calls.
async fn contend(
    mut locker: Locker,
    mut bookkeeping: MultiplexedConnection,
    counter_key: String,
    until: Instant,
) -> (u64, u64) {
    let (mut sections, mut failures) = (0, 0);
    while Instant::now() < until {
        let Ok(held) = locker.try_lock(WAIT).await else {
            failures += 1;
            tokio::time::sleep(PAUSE_AFTER_FAILURE).await;
            continue;
        };
        section(&mut bookkeeping, &counter_key).await;
        sections += 1;
        if locker.try_unlock(held).await.is_err() {
            failures += 1;
        }
    }
    (sections, failures)
}

/// The critical section: a non-atomic GET / +1 / SET of the counter, then
/// the bookkeeping server's clock (µs) pushed to `<counter>:ends`.
async fn section(bookkeeping: &mut MultiplexedConnection, counter_key: &str) {
    let value: Option<u64> = bookkeeping.get(counter_key).await.expect("GET");
    let _: () = bookkeeping
        .set(counter_key, value.unwrap_or(0) + 1)
        .await
        .expect("SET");
    let (seconds, micros): (u64, u64) = redis::cmd("TIME")
        .query_async(bookkeeping)
        .await
        .expect("TIME");
    let _: u64 = bookkeeping
        .rpush(format!("{counter_key}:ends"), seconds * 1_000_000 + micros)
        .await
        .expect("RPUSH");
}

fn print_table(outcomes: &[Outcome], processes: u64, tasks: u64, seconds: u64, rtt: Duration) {
    println!("## RedLock with only a bare majority answering: this project beside rslock\n");
    println!(
        "{processes} processes × {tasks} tasks per implementation and scenario, {seconds} s each, fresh local redis-servers per scenario. \
         Stopped: SIGSTOP (the node accepts connections and never answers); killed: SIGKILL (connections refused). \
         This project waits at most {} s per acquisition; rslock's `acquire` (default retries) retries until it has the lock. \
         A section: GET / +1 / SET of a counter on a separate bookkeeping server, then that server's TIME pushed to a list. \
         Sections/s: (ends − 1) over the span from the first end to the last; × all-up: over the same implementation's with the same number of nodes all up, in this run. Failed calls: lock or unlock calls that returned an error.\n",
        WAIT.as_secs()
    );
    println!("| nodes | down | implementation | sections/s | × all-up | longest gap | failed calls | counter exact | Redis commands per section | Redis CPU per section |");
    println!("|---:|---|---|---:|---:|---:|---:|---|---:|---:|");
    for outcome in outcomes {
        let all_up = outcomes
            .iter()
            .find(|other| {
                other.kind == outcome.kind
                    && other.nodes == outcome.nodes
                    && other.down == Down::None
            })
            .map_or(f64::NAN, |other| other.rate);
        println!(
            "| {} | {} | {} | {} | {} | {} ms | {} | {} | {:.1} | {:.0} µs |",
            outcome.nodes,
            outcome.down.label(),
            outcome.kind.label(),
            figure(outcome.rate),
            figure(outcome.rate / all_up),
            ms(outcome.longest_gap),
            outcome.failures,
            if outcome.counter_exact { "yes" } else { "no" },
            outcome.commands,
            outcome.redis_cpu,
        );
    }
    println!(
        "\nRedis commands per section, by command (calls, and in brackets their command time from \
         INFO commandstats, µs; the server's socket work is in Redis CPU above, not here):\n"
    );
    for outcome in outcomes {
        println!(
            "- {} nodes, {}, {}: {}",
            outcome.nodes,
            outcome.down.label(),
            outcome.kind.label(),
            crate::compare::breakdown_text(&outcome.breakdown),
        );
    }
    println!(
        "\nOne PING round trip on loopback (p50): {:.0} µs.",
        rtt.as_secs_f64() * 1e6
    );
}

/// `value` with at least two significant digits: "1945", "2.4", "0.43",
/// "0.0021"; "n/a" without a value (fewer than two sections).
fn figure(value: f64) -> String {
    if !value.is_finite() {
        return "n/a".to_owned();
    }
    let decimals = if value == 0.0 || value >= 10.0 {
        0
    } else {
        (1.0 - value.log10().floor()) as usize
    };
    format!("{value:.decimals$}")
}
