//! The deployments a run simulates (one node, Sentinel, Cluster, a quorum
//! of 3 or 5), how a client is configured for each, and their failovers:
//! what Sentinel and the Cluster do when a primary stops answering, and the
//! manual failovers an operator starts.

use std::time::Duration;

use lock_runtime::Config;
use sim_redis::{ClusterNode, MasterState, Node, NodeConfig, SentinelNode, Topology, SLOTS};

use crate::rng::Rng;
use crate::world::{Action, Micros, World};

/// Which deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Node,
    Sentinel,
    Cluster,
    Quorum(usize),
}

impl Backend {
    pub fn name(self) -> String {
        match self {
            Backend::Node => "node".into(),
            Backend::Sentinel => "sentinel".into(),
            Backend::Cluster => "cluster".into(),
            Backend::Quorum(n) => format!("quorum{n}"),
        }
    }
}

pub const MASTER: &str = "mymaster";
const PORT: u16 = 7000;
const SENTINEL_PORT: u16 = 26379;

/// What the deployment keeps between its steps.
#[derive(Debug)]
pub enum DeployState {
    Node,
    Quorum,
    Sentinel {
        primary: usize,
        members: Vec<usize>,
        generation: u64,
        /// Each sentinel's configuration epoch: the failover it last
        /// announced (it never goes back to an older one's primary).
        epochs: Vec<u64>,
    },
    Cluster {
        /// Each shard's nodes (the primary first, as the topology says now).
        shards: Vec<Vec<usize>>,
        ids: Vec<String>,
        generation: u64,
    },
}

fn host(name: &str) -> String {
    format!("{name}.sim")
}

/// Builds the deployment's nodes in `world`.
pub fn build(backend: Backend, world: &mut World, rng: &mut Rng, skew_us: i64) -> DeployState {
    let skew = |rng: &mut Rng| {
        if skew_us == 0 {
            0
        } else {
            rng.range(0, 2 * skew_us as u64) as i64 - skew_us
        }
    };
    match backend {
        Backend::Node => {
            let mut node = Node::new(NodeConfig::new(host("n1"), PORT));
            node.set_clock_skew_us(skew(rng));
            world.add_node(node, "n1");
            DeployState::Node
        }
        Backend::Quorum(n) => {
            for i in 1..=n {
                let name = format!("q{i}");
                let mut node = Node::new(NodeConfig::new(host(&name), PORT));
                node.set_clock_skew_us(skew(rng));
                world.add_node(node, &name);
            }
            DeployState::Quorum
        }
        Backend::Sentinel => {
            let mut members = Vec::new();
            for i in 1..=3 {
                let name = format!("d{i}");
                let mut node = Node::new(NodeConfig::new(host(&name), PORT));
                // Replicas' clocks within a few ms of the primary's: a
                // failover takes seconds (design §15, fencing across it).
                node.set_clock_skew_us(skew(rng));
                members.push(world.add_node(node, &name));
            }
            world.follow(members[1], members[0]);
            world.follow(members[2], members[0]);
            for i in 1..=3 {
                let mut sentinel = SentinelNode::new(host(&format!("s{i}")), SENTINEL_PORT);
                let mut state = MasterState::new(host("d1"), PORT);
                state.num_slaves = 2;
                state.num_other_sentinels = 2;
                sentinel.monitor(MASTER, state);
                world.add_sentinel(sentinel);
            }
            DeployState::Sentinel {
                primary: members[0],
                members,
                generation: 0,
                epochs: vec![0; world.sentinels.len()],
            }
        }
        Backend::Cluster => {
            let topology = Topology::new().shared();
            let mut shards = Vec::new();
            let mut ids = Vec::new();
            for shard in 0..3 {
                // Each shard's machines on a clock of their own, up to
                // 250 ms from the other shards' (a primary and its replica
                // stay within the skew of a few ms that fencing across a
                // failover needs, design §2; across shards nothing needs
                // them close). Tokens of a set across shards then differ.
                let offset = if skew_us == 0 {
                    0
                } else {
                    rng.range(0, 500_000) as i64 - 250_000
                };
                let mut nodes = Vec::new();
                for (role, name) in [
                    ("p", format!("p{}", shard + 1)),
                    ("r", format!("r{}", shard + 1)),
                ] {
                    let id = format!("{:0>40}", format!("{name}"));
                    let config = NodeConfig::new(host(&name), PORT)
                        .with_cluster(topology.clone(), id.clone());
                    let mut node = Node::new(config);
                    node.set_clock_skew_us(offset + skew(rng));
                    let at = world.add_node(node, &name);
                    topology.borrow_mut().add_node(ClusterNode {
                        id: id.clone(),
                        host: host(&name),
                        port: PORT,
                        replica_of: None,
                    });
                    let _ = role;
                    while ids.len() <= at {
                        ids.push(String::new());
                    }
                    ids[at] = id;
                    nodes.push(at);
                }
                let per = SLOTS / 3;
                let first = shard as u16 * per;
                let last = if shard == 2 {
                    SLOTS - 1
                } else {
                    first + per - 1
                };
                topology.borrow_mut().assign(first, last, &ids[nodes[0]]);
                topology
                    .borrow_mut()
                    .set_replica_of(&ids[nodes[1]], Some(&ids[nodes[0]]));
                shards.push(nodes);
            }
            world.topology = Some(topology);
            for shard in &shards {
                world.follow(shard[1], shard[0]);
            }
            DeployState::Cluster {
                shards,
                ids,
                generation: 0,
            }
        }
    }
}

/// A client's configuration for the deployment (before the simulation's
/// own settings).
pub fn config(backend: Backend, world: &World) -> Config {
    let url = |node: usize| format!("redis://{}/", world.address_of(node));
    match backend {
        Backend::Node => Config::new(url(0)),
        Backend::Quorum(n) => Config::quorum((0..n).map(url)),
        Backend::Cluster => Config::cluster([0, 2, 4].map(url)),
        Backend::Sentinel => Config::sentinel(
            (1..=3).map(|i| format!("{}:{SENTINEL_PORT}", host(&format!("s{i}")))),
            MASTER,
        ),
    }
}

/// The data nodes that serve `key` (a shard's, or every node), for the
/// checkers: when none of them answers, nobody can know the key is busy.
pub fn serving(state: &DeployState, world: &World, key: &str) -> Vec<usize> {
    match state {
        DeployState::Cluster { shards, .. } => {
            let slot = sim_redis::key_slot(key.as_bytes());
            let shard = (slot / (SLOTS / 3)).min(2) as usize;
            shards[shard].clone()
        }
        _ => (0..world.nodes.len()).collect(),
    }
}

/// A node stopped answering (stalled or killed): Sentinel and the Cluster
/// fail it over if it stays so, after their detection time.
pub fn unavailable(world: &mut World, node: usize) {
    let detect: Micros = match &world.deploy {
        DeployState::Sentinel { primary, .. } if *primary == node => {
            // down-after-milliseconds 1000, then the vote and the promotion.
            world.rng.range(1_000_000, 1_800_000) as Micros
        }
        DeployState::Cluster { shards, .. } if shards.iter().any(|shard| shard[0] == node) => {
            // cluster-node-timeout 1000 and the replica's election.
            world.rng.range(1_200_000, 2_200_000) as Micros
        }
        _ => return,
    };
    let generation = match &world.deploy {
        DeployState::Sentinel { generation, .. } | DeployState::Cluster { generation, .. } => {
            *generation
        }
        _ => 0,
    };
    let at = world.now() + detect;
    world.schedule_action(at, Action::CheckFailover { node, generation });
}

/// The replica of `members` with the most of the primary's stream that
/// answers, if any.
fn best_replica(world: &World, candidates: &[usize]) -> Option<usize> {
    candidates
        .iter()
        .copied()
        .filter(|&n| world.available(n))
        .max_by_key(|&n| {
            (
                world.nodes[n].node.replication_offset(),
                std::cmp::Reverse(n),
            )
        })
}

/// The deployment's own steps.
pub fn act(world: &mut World, action: Action) {
    match action {
        Action::CheckFailover { node, generation } => {
            let current = match &world.deploy {
                DeployState::Sentinel { generation: g, .. }
                | DeployState::Cluster { generation: g, .. } => *g,
                _ => return,
            };
            if current != generation || world.available(node) {
                return;
            }
            fail_over(world, node, false, 0);
        }
        Action::ManualFailover { hold_us } => {
            let primary = match &world.deploy {
                DeployState::Sentinel { primary, .. } => *primary,
                _ => return,
            };
            fail_over(world, primary, true, hold_us);
        }
        Action::ClusterTakeover { shard } => {
            let primary = match &world.deploy {
                DeployState::Cluster { shards, .. } => shards[shard][0],
                _ => return,
            };
            fail_over(world, primary, true, 0);
        }
        Action::Demote { node, to } => {
            // A failover back to it since (two manual failovers in a row):
            // it is the primary again, and stays one.
            let primary_again = match &world.deploy {
                DeployState::Sentinel { primary, .. } => *primary == node,
                DeployState::Cluster { shards, .. } => shards.iter().any(|shard| shard[0] == node),
                _ => false,
            };
            if primary_again {
                let now = world.now();
                if let Some(open) = world.lossy_open.remove(&node) {
                    world.lossy.push((open, now));
                }
                world.note(format!(
                    "deploy: {} stays the primary (failed over back to it)",
                    world.nodes[node].name
                ));
                return;
            }
            world.note(format!(
                "deploy: {} becomes a replica of {}",
                world.nodes[node].name, world.nodes[to].name
            ));
            world.follow(node, to);
            let now = world.now();
            if let Some(open) = world.lossy_open.remove(&node) {
                world.lossy.push((open, now));
            }
        }
        Action::Announce {
            sentinel,
            to,
            epoch,
        } => {
            // A sentinel that already follows a later failover (two manual
            // failovers in a row, announced out of order) keeps its
            // primary, as Sentinel's configuration epochs make it.
            if let DeployState::Sentinel { epochs, .. } = &mut world.deploy {
                if epochs[sentinel] > epoch {
                    world.note(format!(
                        "deploy: sentinel s{} passes over an older failover's +switch-master to {}",
                        sentinel + 1,
                        world.nodes[to].name
                    ));
                    return;
                }
                epochs[sentinel] = epoch;
            }
            let (host, port) = {
                let config = world.nodes[to].node.config();
                (config.host.clone(), config.port)
            };
            world.note(format!(
                "deploy: sentinel s{} announces +switch-master to {}",
                sentinel + 1,
                world.nodes[to].name
            ));
            let now = world.now();
            world.announced.push((now, to));
            let deliveries = world.sentinels[sentinel]
                .node
                .switch_master(MASTER, &host, port);
            world.deliver_sentinel(sentinel, deliveries);
        }
        _ => {}
    }
}

/// Fails `old` over to its best replica. `manual`: an operator's failover
/// (`SENTINEL FAILOVER`, `CLUSTER FAILOVER TAKEOVER`) of a primary that may
/// still answer: it keeps accepting writes for `hold_us` (Sentinel) before
/// it is made a replica.
fn fail_over(world: &mut World, old: usize, manual: bool, hold_us: Micros) {
    let now = world.now();
    let mut deploy = std::mem::replace(&mut world.deploy, DeployState::Node);
    match &mut deploy {
        DeployState::Sentinel {
            primary,
            members,
            generation,
            ..
        } => {
            let candidates: Vec<usize> = members.iter().copied().filter(|&n| n != old).collect();
            let Some(new) = best_replica(world, &candidates) else {
                world.deploy = deploy;
                return;
            };
            *generation += 1;
            *primary = new;
            world.note(format!(
                "deploy: sentinel fails {} over to {}{}",
                world.nodes[old].name,
                world.nodes[new].name,
                if manual { " (manual)" } else { "" }
            ));
            world.promote(new);
            for &other in &candidates {
                if other != new {
                    world.follow(other, new);
                }
            }
            // The old primary is made a replica once the sentinels reach it
            // (when it answers again); a manual failover leaves it writable
            // for a while first.
            let demote = if manual {
                now + hold_us
            } else {
                now + world.rng.range(200_000, 1_500_000) as Micros
            };
            world.lossy_open.insert(old, now);
            world.schedule_action(demote, Action::Demote { node: old, to: new });
            for sentinel in 0..world.sentinels.len() {
                let delay = if manual {
                    world.rng.range(800_000, 1_200_000)
                } else {
                    world.rng.range(0, 300_000)
                } as Micros;
                world.schedule_action(
                    now + delay,
                    Action::Announce {
                        sentinel,
                        to: new,
                        epoch: *generation,
                    },
                );
            }
        }
        DeployState::Cluster {
            shards,
            ids,
            generation,
        } => {
            let Some(shard) = shards.iter().position(|shard| shard[0] == old) else {
                world.deploy = deploy;
                return;
            };
            let candidates: Vec<usize> = shards[shard][1..].to_vec();
            let Some(new) = best_replica(world, &candidates) else {
                world.deploy = deploy;
                return;
            };
            *generation += 1;
            world.note(format!(
                "deploy: cluster fails {} over to {}{}",
                world.nodes[old].name,
                world.nodes[new].name,
                if manual { " (takeover)" } else { "" }
            ));
            if let Some(topology) = &world.topology {
                topology.borrow_mut().fail_over(&ids[new]);
            }
            world.promote(new);
            shards[shard] = vec![new, old];
            world.lossy_open.insert(old, now);
            let demote = now + world.rng.range(0, 500_000) as Micros;
            world.schedule_action(demote, Action::Demote { node: old, to: new });
            for node in 0..world.nodes.len() {
                let deliveries = world.nodes[node].node.topology_changed();
                world.deliver_from(node, deliveries);
            }
        }
        _ => {}
    }
    world.deploy = deploy;
}

/// The longest a deployment takes to fail over after its primary stops
/// answering (detection, promotion, announcement), for the progress bound.
pub fn failover_time(backend: Backend) -> Duration {
    match backend {
        Backend::Sentinel | Backend::Cluster => Duration::from_millis(4_000),
        _ => Duration::ZERO,
    }
}
