//! Resources come back: after runtimes, clients and lock cycles come and go,
//! the process's open file descriptors, the connections Redis sees, the
//! runtime's alive Tokio tasks and the Redis keys return to their baseline.
//!
//! Each scenario runs in a child process of its own. File descriptors are
//! counted for the whole process, and `lock_runtime::init` configures the
//! process-wide client once per process, so two scenarios sharing a process
//! would see each other's descriptors, and a test running beside them (the
//! harness runs tests on parallel threads) would too. Each `#[test]` below
//! therefore re-runs this test binary (`current_exe()`) with
//! `--exact <its name>` and [`SCENARIO_ENV`] set; in that child, the same
//! function finds the variable and runs the scenario, alone in its process.
//! The parents take [`ONE_AT_A_TIME`] so that the children also run one
//! after another: the scenarios hold renewed locks with short ttls and
//! measure timings, and should not compete for the CPU.
//!
//! Connections are counted by Redis (`CLIENT LIST`) over one probe
//! connection opened at the start of each scenario and kept to its end: it
//! is part of every baseline, and no short-lived checking connection can
//! linger in a count.

mod common;
use common::*;

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};

/// Names the scenario a child process runs.
const SCENARIO_ENV: &str = "LOCK_RESOURCES_SCENARIO";

/// The parents run their children one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `scenario` in a child process of its own (see the module comment);
/// `name` must be the calling test function's name.
fn in_own_process(name: &str, scenario: impl FnOnce()) {
    if std::env::var(SCENARIO_ENV).as_deref() == Ok(name) {
        scenario();
        return;
    }
    let _one_at_a_time = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(SCENARIO_ENV, name)
        .output()
        .unwrap_or_else(|error| panic!("cannot re-run the test binary for {name}: {error}"));
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    println!("{name}: child process took {:?}", started.elapsed());
    assert!(
        output.status.success(),
        "{name} failed in its child process ({}); its output is above",
        output.status
    );
    // The child must have run the scenario, not filtered it out.
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("1 passed"),
        "{name} did not run in its child process"
    );
}

/// Open file descriptors of this process (the directory listing's own
/// descriptor included: the same in every count).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What each open descriptor is, for failure messages.
fn fd_targets() -> Vec<String> {
    let mut targets: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let target = std::fs::read_link(&path).ok()?;
            Some(format!("{}->{}", path.display(), target.display()))
        })
        .collect();
    targets.sort();
    targets
}

/// Alive tasks of the current Tokio runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// A connection of the test's own to Redis, kept for the whole scenario.
struct Probe {
    connection: redis::Connection,
}

impl Probe {
    fn new(server: &RedisServer) -> Probe {
        let connection = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        Probe { connection }
    }

    fn client_list(&mut self) -> String {
        redis::cmd("CLIENT")
            .arg("LIST")
            .query(&mut self.connection)
            .unwrap()
    }

    /// Connections Redis sees, other than this probe.
    fn connections(&mut self) -> usize {
        self.client_list().lines().count() - 1
    }

    fn dbsize(&mut self) -> usize {
        redis::cmd("DBSIZE").query(&mut self.connection).unwrap()
    }

    fn keys(&mut self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.connection)
            .unwrap();
        keys.sort();
        keys
    }
}

/// One reading of the process's and Redis's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    fds: usize,
    connections: usize,
    /// Alive tasks of the runtime (0 where no runtime is running).
    tasks: usize,
}

impl Reading {
    /// A reading outside any runtime.
    fn take(probe: &mut Probe) -> Reading {
        Reading {
            fds: open_fds(),
            connections: probe.connections(),
            tasks: 0,
        }
    }

    /// A reading inside a runtime, with its alive tasks.
    fn take_in_runtime(probe: &mut Probe) -> Reading {
        Reading {
            tasks: alive_tasks(),
            ..Reading::take(probe)
        }
    }

    /// Whether every figure is at most `baseline`'s plus `slack`.
    fn within(&self, baseline: &Reading, slack: &Reading) -> bool {
        self.fds <= baseline.fds + slack.fds
            && self.connections <= baseline.connections + slack.connections
            && self.tasks <= baseline.tasks + slack.tasks
    }
}

/// Exactly the baseline: no slack.
const EXACT: Reading = Reading {
    fds: 0,
    connections: 0,
    tasks: 0,
};

/// How long resources may take to come back once their owners are gone:
/// background releases finishing, Redis noticing closed sockets, tasks
/// seeing their client dropped. Only a bound: the readings end as soon as
/// they are back (a leak never comes back), so it is generous for a loaded
/// machine.
const SETTLE: Duration = Duration::from_secs(20);

/// Takes readings until one is within `slack` of `baseline`, for at most
/// [`SETTLE`] (blocking the thread; for use outside a runtime). Returns the
/// last reading.
fn settle(probe: &mut Probe, baseline: &Reading, slack: &Reading) -> Reading {
    let deadline = Instant::now() + SETTLE;
    loop {
        let reading = Reading::take(probe);
        if reading.within(baseline, slack) || Instant::now() >= deadline {
            return reading;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`settle`] inside a runtime, its alive tasks included, yielding to the
/// runtime between readings.
async fn settle_in_runtime(probe: &mut Probe, baseline: &Reading, slack: &Reading) -> Reading {
    let deadline = Instant::now() + SETTLE;
    loop {
        let reading = Reading::take_in_runtime(probe);
        if reading.within(baseline, slack) || Instant::now() >= deadline {
            return reading;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A reading inside a runtime once it stopped changing (the same twice,
/// 50 ms apart; at most [`SETTLE`]): the state of a client that lives on.
async fn steady_in_runtime(probe: &mut Probe) -> Reading {
    let deadline = Instant::now() + SETTLE;
    let mut last = Reading::take_in_runtime(probe);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let reading = Reading::take_in_runtime(probe);
        if reading == last || Instant::now() >= deadline {
            return reading;
        }
        last = reading;
    }
}

/// Panics, with the figures and what is left, unless `after` is within
/// `slack` of `baseline`.
fn assert_back(
    what: &str,
    probe: &mut Probe,
    baseline: &Reading,
    after: &Reading,
    slack: &Reading,
) {
    assert!(
        after.within(baseline, slack),
        "{what}: resources did not come back within {SETTLE:?} (allowed slack {slack:?})\n\
         baseline {baseline:?}\n\
         after    {after:?}\n\
         Redis clients:\n{}\n\
         open fds: {:?}",
        probe.client_list(),
        fd_targets()
    );
}

/// Waits (up to `bound`) until Redis holds no key, and panics with the keys
/// left if it still does.
fn assert_no_keys_left(what: &str, probe: &mut Probe, bound: Duration) {
    let deadline = Instant::now() + bound;
    while probe.dbsize() != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = probe.dbsize();
    assert_eq!(
        left,
        0,
        "{what}: {left} Redis keys left after {bound:?}: {:?}",
        probe.keys()
    );
}

/// How many runtimes scenario 1 creates one after another.
const RUNTIMES: usize = 300;

/// The process-wide client (`init` once) used from 300 current-thread
/// runtimes, created and dropped one after another: each takes and releases
/// a plain lock, a renewed lock, and a lock a waiter waits for (so the
/// client's notification connection opens too). Each runtime's client goes
/// with its runtime: descriptors and connections stay near what the first
/// runtime left, within a constant slack (a leak of one connection, or of a
/// runtime's epoll and eventfd, per runtime would be hundreds).
#[test]
fn the_process_wide_client_across_many_runtimes() {
    in_own_process("the_process_wide_client_across_many_runtimes", || {
        let server = RedisServer::start();
        lock_runtime::init(server.url()).unwrap();
        let mut probe = Probe::new(&server);
        let before = Reading::take(&mut probe);
        let started = Instant::now();
        let mut baseline = None;
        for round in 0..RUNTIMES {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(locks_in_one_runtime(&mut probe));
            drop(runtime);
            if round == 0 {
                // Settled: what the first runtime left behind (if anything).
                let first = settle(&mut probe, &before, &EXACT);
                println!("many runtimes: before any {before:?}; after the first runtime {first:?}");
                baseline = Some(first);
            } else if (round + 1) % 50 == 0 {
                println!(
                    "many runtimes: after {} runtimes {:?}",
                    round + 1,
                    Reading::take(&mut probe)
                );
            }
        }
        let baseline = baseline.unwrap();
        // A constant allowance, far below one descriptor or connection per
        // runtime.
        let slack = Reading {
            fds: 8,
            connections: 2,
            tasks: 0,
        };
        let after = settle(&mut probe, &baseline, &slack);
        println!(
            "many runtimes: after {RUNTIMES} runtimes, settled {after:?} (baseline {baseline:?}); \
             {:?} in all",
            started.elapsed()
        );
        assert_back("many runtimes", &mut probe, &baseline, &after, &slack);
        assert_no_keys_left("many runtimes", &mut probe, Duration::from_secs(1));
    });
}

/// One runtime's work for [`the_process_wide_client_across_many_runtimes`],
/// on the process-wide client.
async fn locks_in_one_runtime(probe: &mut Probe) {
    let plain = Lock::new("runtimes:plain")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    plain.release().await.unwrap();

    let renewed = Lock::new("runtimes:renewed")
        .ttl(Duration::from_secs(2))
        .renew()
        .acquire()
        .await
        .unwrap();
    renewed.release().await.unwrap();

    let waited = Lock::new("runtimes:waited").ttl(Duration::from_secs(10));
    let holder = waited.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let waited = waited.clone().wait(Duration::from_secs(10));
        async move { waited.acquire().await?.release().await }
    });
    // Released once the waiter has queued, so that it is woken by the
    // release (and has opened the client's notification connection).
    wait_until_async("the waiter queued", LINE_TIMEOUT, || {
        redis::cmd("EXISTS")
            .arg("lock:{runtimes:waited}:queue")
            .query::<bool>(&mut probe.connection)
            .unwrap()
    })
    .await;
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
}

/// Clients per kind in scenario 2.
const CLIENTS: usize = 100;

/// 100 clients each taking a renewed lock (ttl 1.2 s), held across a
/// renewal and released, and 100 taking a lock without renewal (a quarter
/// of them dropped instead of released), all clients dropped (half of them
/// in their task, half by the test once the tasks are done): within a
/// bounded wait Redis sees none of their connections, and the process's
/// descriptors and the runtime's alive tasks are back to what they were
/// before the first client.
#[test]
fn dropped_clients_leave_nothing_behind() {
    in_own_process("dropped_clients_leave_nothing_behind", || {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(dropped_clients(&server));
    });
}

async fn dropped_clients(server: &RedisServer) {
    let mut probe = Probe::new(server);
    let baseline = Reading::take_in_runtime(&mut probe);
    let started = Instant::now();

    let renewed: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let url = server.url();
            tokio::spawn(async move {
                let client = Client::new(Config::new(url)).unwrap();
                // 1.2 s: renewed every 400 ms, so a renewal due while 200
                // clients connect on a loaded machine is not late (a lost
                // lock sends no renewal).
                let guard = Lock::new(format!("clients:renewed:{i}"))
                    .ttl(Duration::from_millis(1200))
                    .renew()
                    .client(client.clone())
                    .acquire()
                    .await
                    .unwrap();
                // Half are released once a renewal was answered (the second
                // is sent only after the first's answer), half as soon as
                // one is sent (it may be on the wire during the release).
                let renewals = if i % 2 == 0 { 2 } else { 1 };
                wait_until_async("a renewal was sent", LINE_TIMEOUT, || {
                    client.renewal_stats().renewals_sent >= renewals
                })
                .await;
                guard.release().await.unwrap();
                let stats = client.renewal_stats();
                assert_eq!(stats.active, 0, "{stats:?}");
                // Half are dropped here, on a worker thread, half by the
                // test, outside the runtime's workers.
                (stats, (i % 2 == 0).then_some(client))
            })
        })
        .collect();
    let plain: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let url = server.url();
            tokio::spawn(async move {
                let client = Client::new(Config::new(url)).unwrap();
                let guard = Lock::new(format!("clients:plain:{i}"))
                    .ttl(Duration::from_secs(10))
                    .client(client.clone())
                    .acquire()
                    .await
                    .unwrap();
                if i % 4 == 0 {
                    drop(guard); // released in the background
                } else {
                    guard.release().await.unwrap();
                }
                (i % 2 == 0).then_some(client)
            })
        })
        .collect();
    let mut renewals = 0;
    let mut kept = Vec::new();
    for task in renewed {
        let (stats, client) = task.await.unwrap();
        renewals += stats.renewals_sent;
        kept.extend(client);
    }
    for task in plain {
        kept.extend(task.await.unwrap());
    }
    let during = Reading::take_in_runtime(&mut probe);
    println!(
        "dropped clients: {CLIENTS} renewed ({renewals} renewals sent) and {CLIENTS} plain clients \
         done in {:?}; with {} of them not dropped yet {during:?}",
        started.elapsed(),
        kept.len()
    );
    // Dropped one by one by the test's own thread, which is not one of the
    // runtime's workers: whatever a client's drop wakes runs on a worker,
    // at the same time as the rest of the drop.
    for client in kept {
        drop(client);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let after = settle_in_runtime(&mut probe, &baseline, &EXACT).await;
    println!(
        "dropped clients: baseline {baseline:?}; after all were dropped {after:?} ({:?} in all)",
        started.elapsed()
    );
    assert_back("dropped clients", &mut probe, &baseline, &after, &EXACT);
    assert_no_keys_left("dropped clients", &mut probe, Duration::from_secs(1));
}

/// Lock cycles in scenario 3, and the tasks sharing them.
const CYCLES: usize = 100_000;
const WORKERS: usize = 50;
/// Workers per shared key.
const SHARING: usize = 10;

/// The ttl of the scenario 3 cycles held across a renewal (held until its
/// first renewal is confirmed, a third of it; lost only when that renewal
/// is ~670 ms late).
const RENEWED_TTL_SHORT: Duration = Duration::from_secs(1);

/// What one worker of scenario 3 saw.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    released: usize,
    dropped: usize,
    cancelled: usize,
    renewed: usize,
    shared: usize,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        self.released += other.released;
        self.dropped += other.dropped;
        self.cancelled += other.cancelled;
        self.renewed += other.renewed;
        self.shared += other.shared;
    }
}

/// 100,000 acquire/release cycles on one client, half of them renewed, over
/// 50 tasks with keys of their own and keys shared by ten tasks each
/// (taken with `wait`, so the queue and the notifications are used), some
/// guards dropped instead of released and some acquires cancelled. Nothing
/// grows with the number of cycles while the client lives; once it is
/// dropped, descriptors, connections and tasks are back to what they were
/// before it was built; no key is left in Redis, and no lock is renewed.
#[test]
fn many_lock_cycles_leave_nothing_behind() {
    in_own_process("many_lock_cycles_leave_nothing_behind", || {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(many_lock_cycles(&server));
    });
}

async fn many_lock_cycles(server: &RedisServer) {
    let mut probe = Probe::new(server);
    let baseline = Reading::take_in_runtime(&mut probe);
    let client = Client::new(Config::new(server.url())).unwrap();

    // A warm-up that opens what the client keeps while it lives (its
    // connection, renewal driver and notification connection).
    let warm_up = run_cycles(&client, WORKERS * 20).await;
    let warm = steady_in_runtime(&mut probe).await;
    println!("lock cycles: baseline {baseline:?}; client warmed up {warm:?} ({warm_up:?})");

    let started = Instant::now();
    let tally = run_cycles(&client, CYCLES).await;
    let elapsed = started.elapsed();
    println!(
        "lock cycles: {CYCLES} cycles in {elapsed:?} ({:.0}/s): {tally:?}",
        CYCLES as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(tally.released + tally.dropped + tally.cancelled, CYCLES);
    assert!(tally.cancelled > 0, "no acquire was cancelled: {tally:?}");

    // Nothing grew with the cycles while the client lives.
    let live = settle_in_runtime(&mut probe, &warm, &EXACT).await;
    let stats = client.renewal_stats();
    println!("lock cycles: after them, client alive {live:?}; renewal {stats:?}");
    assert_back(
        "lock cycles, client alive",
        &mut probe,
        &warm,
        &live,
        &EXACT,
    );
    assert_eq!(stats.active, 0, "locks still renewed: {stats:?}");
    assert!(stats.renewals_sent > 0, "no lock was renewed: {stats:?}");
    assert_eq!(stats.lost, 0, "{stats:?}");
    // Background releases and queue departures are done (the tasks settled):
    // no lock, queue, waiters or fence key is left.
    assert_no_keys_left("lock cycles", &mut probe, Duration::from_millis(500));

    drop(client);
    let after = settle_in_runtime(&mut probe, &baseline, &EXACT).await;
    println!("lock cycles: client dropped {after:?} (baseline {baseline:?})");
    assert_back(
        "lock cycles, client dropped",
        &mut probe,
        &baseline,
        &after,
        &EXACT,
    );
}

/// `cycles` lock cycles over [`WORKERS`] tasks on `client`.
async fn run_cycles(client: &Client, cycles: usize) -> Tally {
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let client = client.clone();
            let count = cycles / WORKERS + usize::from(worker < cycles % WORKERS);
            tokio::spawn(async move { cycles_of_one_worker(client, worker, count).await })
        })
        .collect();
    let mut tally = Tally::default();
    for worker in workers {
        tally += worker.await.unwrap();
    }
    tally
}

/// One worker's cycles. Cycle `i`, by `i % 50`:
/// - every fifth (`i % 5 == 4`) on a key shared with other workers, taken
///   with `wait`; the others on the worker's own key;
/// - even ones renewed (ttl 2 s), odd ones not (ttl 10 s); `i % 100 == 50`
///   (own key, released) renewed with a ttl of 1 s and held until
///   its first renewal is confirmed;
/// - `i % 10 == 3` (own key) and `i % 10 == 9` (shared key): guard dropped,
///   released in the background;
/// - `i % 25 == 11` (own key) and `i % 25 == 24` (shared key): the acquire
///   cancelled by a 1 µs timeout (when it did not finish first).
async fn cycles_of_one_worker(client: Client, worker: usize, count: usize) -> Tally {
    let mut tally = Tally::default();
    let own = format!("cycles:own:{worker}");
    let shared = format!("cycles:shared:{}", worker / SHARING);
    // The own key may still be held by a release in the background (after
    // a dropped guard or a cancelled acquire): then it is taken with `wait`.
    let mut own_maybe_held = false;
    for i in 0..count {
        let is_shared = i % 5 == 4;
        let mut lock = Lock::new(if is_shared { &shared } else { &own }).client(client.clone());
        let held_across_renewal = i % 100 == 50;
        lock = if held_across_renewal {
            tally.renewed += 1;
            lock.ttl(RENEWED_TTL_SHORT).renew()
        } else if i % 2 == 0 {
            tally.renewed += 1;
            lock.ttl(Duration::from_secs(2)).renew()
        } else {
            lock.ttl(Duration::from_secs(10))
        };
        if is_shared || own_maybe_held {
            lock = lock.wait(Duration::from_secs(30));
        }
        tally.shared += usize::from(is_shared);
        let guard = if i % 25 == 11 || i % 25 == 24 {
            match tokio::time::timeout(Duration::from_micros(1), lock.acquire()).await {
                Ok(guard) => guard,
                Err(_cancelled) => {
                    tally.cancelled += 1;
                    own_maybe_held |= !is_shared;
                    continue;
                }
            }
        } else {
            lock.acquire().await
        };
        let guard = guard.unwrap_or_else(|error: LockError| {
            panic!("worker {worker}, cycle {i}: {error}");
        });
        let acquired_at = Instant::now();
        if !is_shared {
            own_maybe_held = false;
        }
        if held_across_renewal {
            // Held until its first renewal is confirmed: its validity then
            // ends later than the one the acquire gave it.
            let first_validity = acquired_at + RENEWED_TTL_SHORT;
            let deadline = Instant::now() + LINE_TIMEOUT;
            while Instant::now() + guard.remaining() <= first_validity + Duration::from_millis(20) {
                assert!(
                    guard.is_held() && Instant::now() < deadline,
                    "worker {worker}, cycle {i}: not renewed ({:?})",
                    guard.lost_cause()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if i % 10 == 3 || i % 10 == 9 {
            drop(guard);
            tally.dropped += 1;
            own_maybe_held |= !is_shared;
        } else {
            guard
                .release()
                .await
                .unwrap_or_else(|error| panic!("worker {worker}, cycle {i}: {error}"));
            tally.released += 1;
        }
    }
    tally
}
