//! Deterministic simulation of the lock client's real code (issue 37).
//!
//! A run is one seed and one scenario (a deployment: one node, Sentinel,
//! Cluster, a quorum of 3 or 5): on one thread, under tokio's paused clock,
//! several [`lock_runtime::Client`]s with several tasks each take every kind
//! of lock with every option over a simulated network to simulated Redis
//! nodes ([`sim_redis`], running the project's own Lua), while faults chosen
//! by the seed hit the nodes, the network and the clients. Then checkers
//! read the history: overlapping holds, fencing tokens that go back, keys
//! left behind, calls past their bounds, errors of the wrong kind, no
//! progress once the faults are over. The same seed gives the same history,
//! byte for byte: any failure replays from its seed.
//!
//! ```text
//! cargo run -p lock-sim -- replay --seed 1234 --scenario quorum3
//! cargo run --release -p lock-sim -- run --scenario all --seconds 600
//! ```

pub mod checkers;
pub mod deploy;
pub mod history;
mod net;
pub mod plan;
pub mod rng;
pub mod workload;
pub mod world;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{Client, Config};

pub use checkers::Violation;
pub use deploy::Backend;

use crate::checkers::Facts;
use crate::plan::Plan;
pub use crate::plan::RunKind;
use crate::rng::Rng;
use crate::workload::Env;
use crate::world::{Micros, Shared, World};

/// Every scenario, by name.
pub const SCENARIOS: [&str; 5] = ["node", "sentinel", "cluster", "quorum3", "quorum5"];

pub fn backend(scenario: &str) -> Option<Backend> {
    Some(match scenario {
        "node" => Backend::Node,
        "sentinel" => Backend::Sentinel,
        "cluster" => Backend::Cluster,
        "quorum3" => Backend::Quorum(3),
        "quorum5" => Backend::Quorum(5),
        _ => return None,
    })
}

/// What a run did and what the checkers found.
pub struct Report {
    pub seed: u64,
    pub scenario: String,
    pub history: String,
    pub violations: Vec<Violation>,
    /// Virtual time the run lasted, µs.
    pub virtual_us: Micros,
    pub calls: usize,
    pub holds: usize,
}

impl Report {
    /// The command that replays this run.
    pub fn replay_line(&self) -> String {
        format!(
            "cargo run -p lock-sim -- replay --seed {} --scenario {}",
            self.seed, self.scenario
        )
    }
}

/// Runs `scenario` with `seed`.
pub fn run(scenario: &str, seed: u64) -> Report {
    run_traced(scenario, seed, false)
}

/// Runs `scenario` with `seed`; `trace`: every command and reply in the
/// history too.
pub fn run_traced(scenario: &str, seed: u64, trace: bool) -> Report {
    // A thread of its own with room for the library's futures, which are
    // large in an unoptimised build (a test thread's 2 MiB is not enough).
    let scenario = scenario.to_owned();
    std::thread::Builder::new()
        .name(format!("lock-sim {scenario} {seed}"))
        .stack_size(256 << 20)
        .spawn(move || run_here(&scenario, seed, trace))
        .expect("a simulation thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn run_here(scenario: &str, seed: u64, trace: bool) -> Report {
    let backend = backend(scenario).unwrap_or_else(|| panic!("no scenario {scenario}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    let report = local.block_on(&runtime, simulate(backend, scenario, seed, trace));
    drop(local);
    drop(runtime);
    report
}

async fn simulate(backend: Backend, scenario: &str, seed: u64, trace: bool) -> Report {
    let mut rng = Rng::new(seed ^ scenario_salt(scenario));
    // One run in five is a contention run (`Plan::contended`), drawn apart
    // so that the other runs' plans do not depend on it.
    let plan = Plan::new(backend, &mut rng, run_kind(scenario, seed));
    let mut world = World::new(rng.fork(), plan.net.clone(), plan.epoch_us);
    world.trace = trace;
    let mut build_rng = rng.fork();
    world.deploy = deploy::build(backend, &mut world, &mut build_rng, plan.skew_us);
    world.note(format!("scenario {scenario}, seed {seed}"));
    for line in &plan.summary {
        world.note(format!("plan: {line}"));
    }
    world.note(format!(
        "plan: {} clients, mix {:?}, names {:?}",
        plan.clients.len(),
        plan.mix,
        plan.names
    ));
    for (at, action) in &plan.faults {
        world.schedule_action(*at, action.clone());
    }
    let shared = Shared::new(world);
    let driver = tokio::task::spawn_local(world::drive(Arc::clone(&shared)));

    // The clients.
    let mut clients = Vec::new();
    let mut deadlines = Vec::new();
    for (at, client) in plan.clients.iter().enumerate() {
        let id = shared.with(|world| world.add_client());
        let base = shared.with(|world| deploy::config(backend, world));
        let network = Arc::new(net::SimNetwork {
            shared: Arc::clone(&shared),
            client: id,
        });
        let (start, epoch) = shared.with(|world| (world.instant(0), world.epoch_us));
        let mut config: Config = base
            .network(network)
            .random_seed(client.seed)
            .wall_clock(move || UNIX_EPOCH + Duration::from_micros(epoch as u64) + start.elapsed())
            .instance(format!("c{at}"))
            .connect_timeout(client.connect_timeout)
            .response_timeout(client.response_timeout);
        if let Some((replicas, timeout)) = client.acknowledged {
            config = config.acknowledged(replicas, timeout);
        }
        let made = Client::new(config).expect("a client");
        clients.push(made);
        deadlines.push((client.connect_timeout + client.response_timeout).as_micros() as Micros);
    }
    // When each client learns of a switch of primary, and which locks it
    // concerns (the overlap checker's account of who was told when).
    let mut learners = Vec::new();
    for (at, client) in clients.iter().enumerate() {
        let Some(mut learned) = client.switches_learned() else {
            continue;
        };
        let (client, shared) = (client.clone(), Arc::clone(&shared));
        let mut names = plan.names.exclusive.clone();
        names.push(plan.names.rw.clone());
        names.push(plan.names.semaphore.clone());
        learners.push(tokio::task::spawn_local(async move {
            let mut seen = learned.seen();
            while let Ok(number) = learned.changed().await {
                let concerned: Vec<String> = names
                    .iter()
                    .filter(|name| (seen + 1..=number).any(|n| client.switch_concerns(n, name)))
                    .cloned()
                    .collect();
                seen = number;
                shared.with(|world| {
                    let now = world.now();
                    world.note(format!(
                        "c{at} learned of switch #{number} (concerning {})",
                        concerned.join(" ")
                    ));
                    world.learned.push((now, at, concerned));
                });
            }
        }));
    }
    let env = Arc::new(Env {
        shared: Arc::clone(&shared),
        clients,
        deadlines,
        names: plan.names.clone(),
        mix: plan.mix.clone(),
        backend,
    });

    // The tasks.
    let mut tasks = Vec::new();
    for (client, client_plan) in plan.clients.iter().enumerate() {
        for task in 0..client_plan.tasks {
            let task_rng = rng.fork();
            let handle = tokio::task::spawn_local(workload::task(
                Arc::clone(&env),
                client,
                task,
                plan.roles[client][task].clone(),
                task_rng,
                plan.end,
            ));
            tasks.push((format!("c{client}.t{task}"), handle));
        }
    }
    // Each task's last operation ends within its bounds; a task still
    // running long after is hung.
    let give_up = plan.end + 120_000_000;
    let mut hung = Vec::new();
    for (name, handle) in tasks {
        let left = give_up - shared.with(|world| world.now());
        match tokio::time::timeout(Duration::from_micros(left.max(0) as u64), handle).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => hung.push(format!("task {name} panicked: {error}")),
            Err(_) => hung.push(format!(
                "task {name} still running {:.3} ms after the workload's end",
                (give_up - plan.end) as f64 / 1000.0
            )),
        }
    }
    let finished = shared.with(|world| world.now());
    for learner in learners {
        learner.abort();
    }
    drop(env);
    // Everyone finished: every ttl, queue place, fence and holder record
    // expires within this.
    let settle = plan.max_ttl() + 70_000_000;
    tokio::time::sleep(Duration::from_micros(settle as u64)).await;
    let leftovers = shared.with(|world| {
        let mut left = Vec::new();
        for node in 0..world.nodes.len() {
            if !world.nodes[node].up || world.nodes[node].node.is_replica() {
                continue;
            }
            for (key, expire) in world.live_keys(node) {
                left.push(format!(
                    "{}: {}{}",
                    world.nodes[node].name,
                    String::from_utf8_lossy(&key),
                    if expire.is_none() { " (no expiry)" } else { "" }
                ));
            }
        }
        left
    });
    let end = shared.with(|world| {
        let now = world.now();
        world.close_intervals(now);
        world.note(format!(
            "end: tasks finished at {:.3} ms",
            finished as f64 / 1000.0
        ));
        now
    });
    let _ = end;
    let report = shared.with(|world| {
        let nodes = world.nodes.len();
        let quorum = matches!(backend, Backend::Quorum(_));
        let serving: checkers::Serving = match backend {
            Backend::Cluster => {
                let shards: Vec<Vec<usize>> = (0..3).map(|s| vec![2 * s, 2 * s + 1]).collect();
                Box::new(move |key: &str| {
                    let slot = sim_redis::key_slot(format!("lock:{{{key}}}").as_bytes());
                    let shard = (slot / (sim_redis::SLOTS / 3)).min(2) as usize;
                    (shards[shard].clone(), 1)
                })
            }
            _ => Box::new(move |_key: &str| {
                ((0..nodes).collect(), if quorum { nodes / 2 + 1 } else { 1 })
            }),
        };
        let facts = Facts {
            lossy: world.lossy.clone(),
            outages: world.outages.clone(),
            pauses: world.pauses.clone(),
            serving,
            max_delay: world.max_delay(),
            healed: plan.healed,
            end: plan.end,
            progress_bound: plan.progress_bound,
            leftovers,
            hung,
            renewal_created: world.renewal_created.clone(),
            announced: world.announced.clone(),
            silenced: world.silenced.clone(),
            learned: world.learned.clone(),
        };
        let violations = checkers::check(&world.rec, &facts);
        for violation in &violations {
            world.note(format!("VIOLATION {}: {}", violation.kind, violation.text));
        }
        let history = history::render(&world.rec.lines);
        let report = Report {
            seed,
            scenario: scenario.to_owned(),
            history,
            violations,
            virtual_us: world.now(),
            calls: world.rec.calls.len(),
            holds: world.rec.holds.len(),
        };
        world.shut();
        report
    });
    driver.abort();
    report
}

const CONTENTION_SALT: u64 = 0xc0_47e7_7104;
const SWITCHING_SALT: u64 = 0x5e1f_c4ed;

/// Whether `seed` of `scenario` is a contention run (one in five).
pub fn contended(scenario: &str, seed: u64) -> bool {
    Rng::new(seed ^ scenario_salt(scenario) ^ CONTENTION_SALT).chance(20)
}

/// The kind of the run of `seed` in `scenario`: one in five a contention
/// run; with Sentinel or a Cluster, one in four of the others a switching
/// run (`Plan::switching`). Drawn apart from the plan, so that the other
/// runs' plans do not depend on it.
pub fn run_kind(scenario: &str, seed: u64) -> RunKind {
    if contended(scenario, seed) {
        RunKind::Contended
    } else if matches!(scenario, "sentinel" | "cluster")
        && Rng::new(seed ^ scenario_salt(scenario) ^ SWITCHING_SALT).chance(25)
    {
        RunKind::Switching
    } else {
        RunKind::Mixed
    }
}

fn scenario_salt(scenario: &str) -> u64 {
    scenario
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The wall clock a client reads: the run's virtual time.
pub fn virtual_wall(epoch_us: i64, elapsed: Duration) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(epoch_us as u64) + elapsed
}
