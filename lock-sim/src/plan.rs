//! A run's plan, drawn from its seed: the deployment's clients, their
//! timeouts, the network's character, the workload's mix, and the faults
//! with their instants.

use std::time::Duration;

use crate::deploy::Backend;
use crate::rng::Rng;
use crate::workload::{Mix, Names, Role};
use crate::world::{Action, Micros, NetParams};

#[derive(Clone)]
pub struct ClientPlan {
    pub tasks: usize,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    /// Acknowledged mode (Sentinel, Cluster): replicas and their timeout.
    pub acknowledged: Option<(u32, Duration)>,
    pub seed: u64,
}

pub struct Plan {
    pub backend: Backend,
    pub clients: Vec<ClientPlan>,
    pub net: NetParams,
    /// Each node's clock is off by up to this (µs), either way.
    pub skew_us: i64,
    pub faults: Vec<(Micros, Action)>,
    /// When the last fault is over (failovers done, network calm).
    pub healed: Micros,
    /// When the tasks stop starting operations.
    pub end: Micros,
    /// Some acquisition must succeed within this after `healed`.
    pub progress_bound: Micros,
    pub mix: Mix,
    pub names: Names,
    pub epoch_us: i64,
    /// What the plan's faults are, for the history's first lines.
    pub summary: Vec<String>,
    /// Each task's role, by client (`Role::Any` in a mixed run).
    pub roles: Vec<Vec<Role>>,
}

/// What a run is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    /// Every primitive and option, with faults.
    Mixed,
    /// Quick lockers of a few keys and sets of them, no faults
    /// (`Plan::contended`).
    Contended,
    /// Quick renewed lockers of one shard through failovers
    /// (`Plan::switching`).
    Switching,
}

const MS: Micros = 1000;
const S: Micros = 1_000_000;

impl Plan {
    /// A run's plan of kind `kind`: a mixed run, or one of the focused
    /// runs below.
    pub fn new(backend: Backend, rng: &mut Rng, kind: RunKind) -> Plan {
        let plan = Plan::mixed(backend, rng);
        match kind {
            RunKind::Mixed => plan,
            RunKind::Contended => plan.contended(rng),
            RunKind::Switching => plan.switching(rng),
        }
    }

    fn mixed(backend: Backend, rng: &mut Rng) -> Plan {
        let quorum = matches!(backend, Backend::Quorum(_));
        let replicated = matches!(backend, Backend::Sentinel | Backend::Cluster);
        let nodes = match backend {
            Backend::Node => 1,
            Backend::Quorum(n) => n,
            Backend::Sentinel => 3,
            Backend::Cluster => 6,
        };
        let epoch_us = 1_700_000_000_000_000 + rng.below(86_400_000_000) as i64;

        // The workload.
        let focus = rng.chance(30).then(|| rng.below(5) as usize);
        let mut weights = [0u64; 5];
        for (at, weight) in weights.iter_mut().enumerate() {
            *weight = match focus {
                Some(only) if only == at => 10,
                Some(_) => 0,
                None => rng.range(0, 10),
            };
        }
        weights[4] = weights[4].min(3);
        if weights.iter().all(|weight| *weight == 0) {
            weights[0] = 10;
        }
        let short = rng.chance(40);
        let ttl_ms = if short { (20, 200) } else { (50, 2_000) };
        let mix = Mix {
            weights,
            fair_pct: if quorum { 0 } else { rng.range(0, 50) },
            fencing_pct: rng.range(0, 60),
            renew_pct: rng.range(0, 60),
            hold_at_least_pct: rng.range(0, 20),
            wait_pct: rng.range(40, 95),
            cancel_pct: rng.range(0, 15),
            ttl_ms,
            wait_ms: if short { 300 } else { rng.range(300, 3_000) },
            steps: rng.range(1, 5),
            step_ms: if short {
                rng.range(1, 60)
            } else {
                rng.range(1, 600)
            },
            idle_ms: rng.range(0, 30),
            fair_ok: !quorum,
        };
        let exclusive = if backend == Backend::Cluster && rng.chance(50) {
            vec!["{t}x".to_owned(), "{t}y".to_owned(), "{t}z".to_owned()]
        } else {
            vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]
        };
        let names = Names {
            exclusive,
            rw: "rw".to_owned(),
            semaphore: "sem".to_owned(),
            capacity: rng.range(1, 3) as u32,
        };

        // The clients.
        let client_count = rng.range(2, 4) as usize;
        let clients = (0..client_count)
            .map(|_| {
                let long = backend == Backend::Sentinel && rng.chance(15);
                let response_ms = if long {
                    rng.range(2_000, 8_000)
                } else {
                    rng.range(50, 1_000)
                };
                ClientPlan {
                    tasks: rng.range(1, 3) as usize,
                    connect_timeout: Duration::from_millis(rng.range(50, 500)),
                    response_timeout: Duration::from_millis(response_ms),
                    acknowledged: (replicated && rng.chance(25))
                        .then(|| (1, Duration::from_millis(rng.range(10, response_ms / 2)))),
                    seed: rng.next_u64(),
                }
            })
            .collect::<Vec<_>>();
        let max_deadline = clients
            .iter()
            .map(|c| (c.connect_timeout + c.response_timeout).as_micros() as Micros)
            .max()
            .unwrap_or(0);

        // The network.
        let faulty_net = rng.chance(50);
        let net = NetParams {
            min_us: rng.range(50, 300) as Micros,
            max_us: rng.range(300, 3_000) as Micros,
            spike_per_mille: if faulty_net { rng.range(0, 20) } else { 0 },
            spike_us: rng.range(5, 200) as Micros * MS,
            lost_reply_per_mille: if faulty_net { rng.range(0, 6) } else { 0 },
            late_per_mille: if faulty_net { rng.range(0, 4) } else { 0 },
            late_us: rng.range(10, 2_000) as Micros * MS,
            repl_min_us: 100,
            repl_max_us: rng.range(200, 20_000) as Micros,
        };
        let skew_us = if rng.chance(50) {
            rng.range(0, if replicated { 5 } else { 50 }) as Micros * MS
        } else {
            0
        };

        // The faults.
        let window = rng.range(2, 8) as Micros * S;
        let mut faults = Vec::new();
        let mut summary = Vec::new();
        let mut healed = 0;
        let max_ttl = ttl_ms.1 as Micros * MS;
        let failover = crate::deploy::failover_time(backend).as_micros() as Micros;
        let fault_count = if rng.chance(15) { 0 } else { rng.range(1, 5) };
        for _ in 0..fault_count {
            let at = rng.range(100, window as u64 / 1000) as Micros * MS;
            let node = rng.below(nodes as u64) as usize;
            // Sentinel and Cluster faults hit a primary most of the time.
            let node = if replicated && rng.chance(70) {
                match backend {
                    Backend::Cluster => 2 * rng.below(3) as usize,
                    _ => 0,
                }
            } else {
                node
            };
            let client = rng.below(client_count as u64) as usize;
            let lasting = rng.range(10, 3_000) as Micros * MS;
            match rng.below(if replicated { 7 } else { 5 }) {
                0 | 1 => {
                    faults.push((at, Action::Stall(node)));
                    faults.push((at + lasting, Action::Resume(node)));
                    summary.push(format!("stall node {node} at {at} for {lasting} us"));
                    healed = healed.max(at + lasting + failover);
                }
                2 => {
                    // Over a quorum, a node restarts empty only after the
                    // longest ttl (RedLock's delayed restart).
                    let down = if quorum {
                        lasting + max_ttl + 100 * MS
                    } else {
                        lasting
                    };
                    faults.push((at, Action::Kill(node)));
                    faults.push((at + down, Action::Restart(node)));
                    summary.push(format!(
                        "kill node {node} at {at}, restart empty after {down} us"
                    ));
                    healed = healed.max(at + down + failover);
                }
                3 => {
                    faults.push((at, Action::PauseClient(client)));
                    faults.push((at + lasting, Action::ResumeClient(client)));
                    summary.push(format!("pause client {client} at {at} for {lasting} us"));
                    healed = healed.max(at + lasting);
                }
                4 => {
                    faults.push((at, Action::Cut(client, node)));
                    summary.push(format!("cut client {client} from node {node} at {at}"));
                    healed = healed.max(at);
                }
                5 => match backend {
                    Backend::Sentinel => {
                        let hold_us = rng.range(300, 3_000) as Micros * MS;
                        faults.push((at, Action::ManualFailover { hold_us }));
                        summary.push(format!(
                            "manual failover at {at}, old primary writable {hold_us} us"
                        ));
                        healed = healed.max(at + hold_us + failover);
                    }
                    _ => {
                        let shard = rng.below(3) as usize;
                        faults.push((at, Action::ClusterTakeover { shard }));
                        summary.push(format!("takeover of shard {shard} at {at}"));
                        healed = healed.max(at + failover);
                    }
                },
                _ => {
                    let replica = match backend {
                        Backend::Cluster => 2 * rng.below(3) as usize + 1,
                        _ => 1 + rng.below(2) as usize,
                    };
                    faults.push((at, Action::Link(replica, false)));
                    faults.push((at + lasting, Action::Link(replica, true)));
                    summary.push(format!(
                        "cut replication to node {replica} at {at} for {lasting} us"
                    ));
                    healed = healed.max(at + lasting);
                }
            }
        }
        // A quorum that runs on a bare majority for the whole run.
        if quorum && rng.chance(20) {
            let down = (nodes - 1) / 2;
            for node in 0..down {
                faults.push((0, Action::Kill(nodes - 1 - node)));
            }
            summary.push(format!("a bare majority: {down} nodes killed for good"));
        }
        let calm = window;
        faults.push((calm, Action::CalmNetwork));
        healed = healed.max(calm);
        let max_wait = mix.wait_ms as Micros * MS;
        let max_body = (mix.steps * mix.step_ms) as Micros * MS;
        let progress_bound = max_ttl + max_wait + max_body + 2 * max_deadline + 3 * S + failover;
        let end = healed + progress_bound + S;
        Plan {
            roles: clients.iter().map(|c| vec![Role::Any; c.tasks]).collect(),
            backend,
            clients,
            net,
            skew_us,
            faults,
            healed,
            end,
            progress_bound,
            mix,
            names,
            epoch_us,
            summary,
        }
    }

    /// A contention run: quick single-key lockers (one key per task, a
    /// section of a few ms, then at once again) among tasks that ask for
    /// sets of those keys with waits of seconds, on a calm network with no
    /// faults: issue 36's starvation holes and `fair`'s order need
    /// hundreds of sections of a key within one set's wait, which the
    /// mixed runs seldom have (design §17).
    fn contended(mut self, rng: &mut Rng) -> Plan {
        let fair_ok = self.mix.fair_ok;
        self.mix = Mix {
            weights: [10, 0, 0, 0, 0],
            fair_pct: if fair_ok { rng.range(0, 70) } else { 0 },
            fencing_pct: rng.range(0, 50),
            renew_pct: rng.range(0, 20),
            hold_at_least_pct: 0,
            wait_pct: 100,
            cancel_pct: 0,
            ttl_ms: (200, 2_000),
            wait_ms: 4_000,
            steps: 1,
            step_ms: rng.range(1, 5),
            idle_ms: 0,
            fair_ok,
        };
        self.names
            .exclusive
            .truncate(if rng.chance(50) { 2 } else { 3 });
        while self.clients.len() < 3 {
            let more = ClientPlan {
                seed: rng.next_u64(),
                ..self.clients[0].clone()
            };
            self.clients.push(more);
        }
        for client in &mut self.clients {
            client.acknowledged = None;
            client.response_timeout = client.response_timeout.min(Duration::from_millis(1_000));
        }
        // The roles: one or two tasks ask for sets; each key has one to
        // three lockers, all in one client (a cohort: one place in line,
        // the lock passed among them) or each in a client drawn at random.
        let clients = self.clients.len();
        let mut roles: Vec<Vec<Role>> = vec![Vec::new(); clients];
        let setters = rng.range(1, 2);
        for _ in 0..setters {
            roles[rng.below(clients as u64) as usize].push(Role::Sets);
        }
        let cohorts = rng.chance(50);
        let mut lockers = Vec::new();
        for (at, key) in self.names.exclusive.iter().enumerate() {
            let count = rng.range(1, 3);
            lockers.push(count);
            for _ in 0..count {
                let client = if cohorts {
                    at % clients
                } else {
                    rng.below(clients as u64) as usize
                };
                roles[client].push(Role::Single(key.clone()));
            }
        }
        for (client, roles) in self.clients.iter_mut().zip(&roles) {
            client.tasks = roles.len();
        }
        self.roles = roles;
        let total: usize = self.clients.iter().map(|c| c.tasks).sum();
        self.net.spike_per_mille = 0;
        self.net.lost_reply_per_mille = 0;
        self.net.late_per_mille = 0;
        self.faults = vec![(0, Action::CalmNetwork)];
        self.healed = 0;
        self.summary = vec![format!(
            "contention: {total} tasks, {setters} asking for sets of {:?}, lockers per key {lockers:?}{}, no faults",
            self.names.exclusive,
            if cohorts { " (each key's in one client)" } else { "" }
        )];
        let max_deadline = self.max_deadline();
        self.progress_bound =
            self.max_ttl() + self.mix.wait_ms as Micros * MS + 2 * max_deadline + 3 * S;
        // Long enough for several set waits; progress is checked too.
        self.end = self.progress_bound + S;
        self
    }

    /// A switching run (Sentinel and Cluster): quick renewed sections of
    /// one or two keys of one shard, by tasks of three to five clients,
    /// through one or two failovers of that shard's primary (a manual one
    /// that leaves the old primary writable, a crash, a `CLUSTER FAILOVER
    /// TAKEOVER`), with replication lagging a few milliseconds and no
    /// other fault: a lock the new primary lacks while its holder is in
    /// its section, and another client taking it there, need a failover
    /// while a key changes hands hundreds of times a second, which the
    /// mixed runs seldom have (the overlap after `CLUSTER FAILOVER FORCE`,
    /// design §15 and §17).
    fn switching(mut self, rng: &mut Rng) -> Plan {
        let fair_ok = self.mix.fair_ok;
        self.mix = Mix {
            weights: [10, 0, 0, 0, 0],
            fair_pct: if fair_ok { rng.range(0, 50) } else { 0 },
            fencing_pct: rng.range(0, 50),
            renew_pct: rng.range(80, 100),
            hold_at_least_pct: 0,
            wait_pct: rng.range(50, 100),
            cancel_pct: 0,
            ttl_ms: (300, 3_000),
            wait_ms: 4_000,
            steps: 1,
            step_ms: rng.range(1, 100),
            idle_ms: 0,
            fair_ok,
        };
        self.names.exclusive = if self.backend == Backend::Cluster {
            vec!["{t}x".to_owned(), "{t}y".to_owned()]
        } else {
            vec!["a".to_owned(), "b".to_owned()]
        };
        self.names
            .exclusive
            .truncate(if rng.chance(50) { 1 } else { 2 });
        let clients = rng.range(3, 5) as usize;
        while self.clients.len() < clients {
            let more = ClientPlan {
                seed: rng.next_u64(),
                ..self.clients[0].clone()
            };
            self.clients.push(more);
        }
        self.clients.truncate(clients);
        for client in &mut self.clients {
            client.acknowledged = None;
            client.tasks = rng.range(1, 2) as usize;
        }
        self.roles = self
            .clients
            .iter()
            .map(|client| {
                (0..client.tasks)
                    .map(|_| {
                        let at = rng.below(self.names.exclusive.len() as u64) as usize;
                        Role::Single(self.names.exclusive[at].clone())
                    })
                    .collect()
            })
            .collect();
        self.net.spike_per_mille = 0;
        self.net.lost_reply_per_mille = 0;
        self.net.late_per_mille = 0;
        self.net.repl_max_us = rng.range(1_000, 30_000) as Micros;
        // The shard of the keys ({t}: one slot), or Sentinel's primary.
        let shard = {
            let key = format!("lock:{{{}}}", self.names.exclusive[0]);
            let slot = sim_redis::key_slot(key.as_bytes());
            (slot / (sim_redis::SLOTS / 3)).min(2) as usize
        };
        let mut faults = vec![];
        let mut summary = vec![];
        let mut at = 0;
        for _ in 0..rng.range(1, 2) {
            at += rng.range(300, 2_500) as Micros * MS;
            let action = match (self.backend, rng.below(3)) {
                (Backend::Cluster, 0) => {
                    faults.push((at, Action::Kill(2 * shard)));
                    summary.push(format!("kill node {} at {at} for good", 2 * shard));
                    break;
                }
                (Backend::Cluster, _) => Action::ClusterTakeover { shard },
                (_, 0) => {
                    faults.push((at, Action::Kill(0)));
                    summary.push(format!("kill node 0 at {at} for good"));
                    break;
                }
                _ => Action::ManualFailover {
                    hold_us: rng.range(300, 3_000) as Micros * MS,
                },
            };
            summary.push(format!("{action:?} at {at}"));
            faults.push((at, action));
        }
        let failover = crate::deploy::failover_time(self.backend).as_micros() as Micros;
        self.healed = at + 3 * S + failover;
        faults.push((self.healed, Action::CalmNetwork));
        self.faults = faults;
        let total: usize = self.clients.iter().map(|c| c.tasks).sum();
        summary.insert(
            0,
            format!(
                "switching: {total} tasks on {:?} through failovers, replication lag up to {} us",
                self.names.exclusive, self.net.repl_max_us
            ),
        );
        self.summary = summary;
        let max_deadline = self.max_deadline();
        self.progress_bound =
            self.max_ttl() + self.mix.wait_ms as Micros * MS + 2 * max_deadline + 3 * S + failover;
        self.end = self.healed + self.progress_bound + S;
        self
    }

    /// The longest call deadline of the run's clients.
    fn max_deadline(&self) -> Micros {
        self.clients
            .iter()
            .map(|c| (c.connect_timeout + c.response_timeout).as_micros() as Micros)
            .max()
            .unwrap_or(0)
    }

    pub fn max_ttl(&self) -> Micros {
        self.mix.ttl_ms.1 as Micros * MS
    }
}
