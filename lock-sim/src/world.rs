//! The simulated world: Redis nodes (sim-redis), sentinels, the network
//! between them and the clients, and the events that move them, on one
//! thread and the virtual clock of a paused tokio runtime.
//!
//! Everything happens as an event at a virtual instant, processed in the
//! order (instant, sequence number): a request reaching a node, a reply or
//! a pub/sub message reaching a client, a replication step, a fault. The
//! driver task ([`drive`]) sleeps until the next event; tokio's paused
//! clock jumps there when every task waits. So a run is a function of its
//! seed.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Duration;

use redis::{PushInfo, PushKind, RedisError, RedisResult, Value};
use sim_redis::{ConnId, Executed, Node, Publication, SentinelNode, SharedTopology, WaitRequest};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::rng::Rng;

/// Virtual microseconds since the run started.
pub type Micros = i64;

/// The world, shared by the network's connections, the driver and the
/// workload. Only ever touched from the run's one thread (checked), which is
/// what makes the `Send`/`Sync` the seam asks for sound.
pub struct Shared {
    world: RefCell<World>,
    thread: ThreadId,
    /// Wakes the driver when an event is scheduled earlier than it sleeps.
    pub wake: Notify,
}

// SAFETY: `world` is only borrowed through `with`, which checks that the
// caller is the thread that made it (the run's one thread); the runtime is
// a `current_thread` one and nothing is sent to another thread.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    pub fn new(world: World) -> Arc<Shared> {
        Arc::new(Shared {
            world: RefCell::new(world),
            thread: std::thread::current().id(),
            wake: Notify::new(),
        })
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        assert_eq!(
            std::thread::current().id(),
            self.thread,
            "the simulated world is touched from another thread"
        );
        let result = f(&mut self.world.borrow_mut());
        self.wake.notify_one();
        result
    }

    /// As [`with`](Shared::with), without waking the driver (the driver's
    /// own steps).
    fn quietly<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        assert_eq!(
            std::thread::current().id(),
            self.thread,
            "the simulated world is touched from another thread"
        );
        f(&mut self.world.borrow_mut())
    }
}

/// Where an address leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Node(usize),
    Sentinel(usize),
}

/// The network's character for a run.
#[derive(Clone, Debug)]
pub struct NetParams {
    /// One-way delay, µs.
    pub min_us: i64,
    pub max_us: i64,
    /// Per mille of messages delayed much more (up to `spike_us`).
    pub spike_per_mille: u64,
    pub spike_us: i64,
    /// Per mille of requests whose reply is lost: the connection stops
    /// answering (the client's deadline replaces it).
    pub lost_reply_per_mille: u64,
    /// Per mille of requests that reach their node late (up to `late_us`),
    /// through a connection that broke meanwhile: the client re-sends, the
    /// node sees both copies.
    pub late_per_mille: u64,
    pub late_us: i64,
    /// Replication delay, µs.
    pub repl_min_us: i64,
    pub repl_max_us: i64,
}

/// A data node and what the network knows of it.
pub struct NodeSlot {
    pub node: Node,
    pub name: String,
    pub up: bool,
    pub stalled: bool,
    /// Requests that reached it while stalled, in order.
    parked: VecDeque<(u64, Batch)>,
    /// Blocked `WAIT`s: the connection and its request.
    waits: Vec<(u64, WaitRequest)>,
    /// The primary it replicates from, and whether that link is up.
    pub follows: Option<usize>,
    pub link_up: bool,
    /// It must resynchronise (`PSYNC`) before applying entries.
    needs_sync: bool,
    repl_scheduled: bool,
}

pub struct SentinelSlot {
    pub node: SentinelNode,
    pub up: bool,
}

/// A batch of commands sent in one write, and how far it got.
pub struct Batch {
    commands: Vec<Vec<Vec<u8>>>,
    replies: Vec<Value>,
    pushes: Vec<PushInfo>,
    next: usize,
    reply: Option<oneshot::Sender<RedisResult<Vec<Value>>>>,
}

/// One connection of a client, as the network keeps it.
struct ConnState {
    client: usize,
    target: Target,
    /// The node's connection for commands (RESP2, as the client parses).
    cmd: ConnId,
    /// The node's connection for subscriptions (RESP3 pushes), opened by
    /// the first subscribe.
    sub: Option<ConnId>,
    /// The connection broke (its node was killed): every call fails.
    broken: bool,
    /// The connection stopped answering (a lost reply): nothing more comes.
    silent: bool,
    /// The client closed it: the node closes it once what was sent arrived.
    closing: bool,
    last_up: Micros,
    last_down: Micros,
    pushes: Option<mpsc::UnboundedSender<PushInfo>>,
    /// A batch blocked in `WAIT`, and those that came after it.
    blocked: Option<Batch>,
    queued: VecDeque<Batch>,
}

/// A batch a paused client sent: its connection, commands and reply.
type Held = (
    u64,
    Vec<Vec<Vec<u8>>>,
    oneshot::Sender<RedisResult<Vec<Value>>>,
);

/// What a client's network knows of it.
#[derive(Default)]
pub struct ClientNet {
    pub paused: bool,
    /// What it sent while paused (sent when it resumes).
    outbox: Vec<Held>,
    /// What reached it while paused (delivered when it resumes).
    inbox: Vec<Event>,
}

/// A fault or a step of the deployment, scheduled at an instant.
#[derive(Clone, Debug)]
pub enum Action {
    Stall(usize),
    Resume(usize),
    Kill(usize),
    Restart(usize),
    PauseClient(usize),
    ResumeClient(usize),
    /// Breaks every connection of a client to a node.
    Cut(usize, usize),
    /// A replica's link to its primary goes down or up.
    Link(usize, bool),
    /// Sentinel or the Cluster checks whether a primary it found silent is
    /// still so, and fails it over (`generation`: no failover since).
    CheckFailover {
        node: usize,
        generation: u64,
    },
    /// `SENTINEL FAILOVER`: the old primary keeps accepting writes for
    /// `hold_us` before it is made a replica.
    ManualFailover {
        hold_us: i64,
    },
    /// `CLUSTER FAILOVER TAKEOVER` on a shard's replica.
    ClusterTakeover {
        shard: usize,
    },
    /// A former primary is made a replica of `to`.
    Demote {
        node: usize,
        to: usize,
    },
    /// A sentinel announces `+switch-master` to `to`, the primary of the
    /// failover of configuration epoch `epoch`.
    Announce {
        sentinel: usize,
        to: usize,
        epoch: u64,
    },
    /// Messages are no longer lost, late or much delayed.
    CalmNetwork,
}

pub enum Event {
    Arrive {
        conn: u64,
        batch: Batch,
    },
    /// A request that reaches its node late, on a connection of its own.
    Late {
        target: Target,
        commands: Vec<Vec<Vec<u8>>>,
    },
    Close {
        conn: u64,
    },
    Reply {
        conn: u64,
        reply: oneshot::Sender<RedisResult<Vec<Value>>>,
        result: RedisResult<Vec<Value>>,
    },
    Push {
        conn: u64,
        push: PushInfo,
    },
    Replicate {
        replica: usize,
    },
    WaitTimeout {
        node: usize,
        conn: u64,
    },
    Relay {
        node: usize,
        publication: Publication,
    },
    Action(Action),
}

pub struct World {
    start: Instant,
    /// The nodes' wall clock at the run's start, µs since the epoch.
    pub epoch_us: i64,
    pub rng: Rng,
    pub net: NetParams,
    pub nodes: Vec<NodeSlot>,
    pub sentinels: Vec<SentinelSlot>,
    pub topology: Option<SharedTopology>,
    addresses: BTreeMap<String, Target>,
    conns: BTreeMap<u64, ConnState>,
    next_conn: u64,
    /// A node's connection → the network's, for deliveries.
    by_node_conn: BTreeMap<(Target, ConnId), u64>,
    events: BTreeMap<(Micros, u64), Event>,
    seq: u64,
    pub clients: Vec<ClientNet>,
    pub rec: crate::history::Recorder,
    /// The deployment's own state (failovers).
    pub deploy: crate::deploy::DeployState,
    /// Intervals in which writes may have been lost (a failover to a replica
    /// that lacked some, a primary restarted empty): the guarantees of
    /// design §9 exempt overlaps they cause.
    pub lossy: Vec<(Micros, Micros)>,
    pub lossy_open: BTreeMap<usize, Micros>,
    /// Nodes that were unavailable (down or stalled), as intervals, for the
    /// checkers: node → [(from, to)].
    pub outages: BTreeMap<usize, Vec<(Micros, Micros)>>,
    outage_open: BTreeMap<usize, Micros>,
    /// Client pauses: client → [(from, to)].
    pub pauses: BTreeMap<usize, Vec<(Micros, Micros)>>,
    pause_open: BTreeMap<usize, Micros>,
    /// Counts, for the report.
    pub stats: BTreeMap<&'static str, u64>,
    /// Log every command and its reply in the history (`replay --trace`).
    pub trace: bool,
    /// Scripts seen, by SHA1: the name in their header.
    scripts: BTreeMap<String, String>,
    /// Lock keys a renewal (`RENEW`) brought back on a node where they were
    /// gone: (when, node, key). A released or expired lock is never
    /// extended again (design §5); the checkers report each.
    pub renewal_created: Vec<(Micros, String, String)>,
    /// Sentinels' `+switch-master` announcements: (when, the node named).
    pub announced: Vec<(Micros, usize)>,
    /// Connections that stopped answering (a lost reply, a late request):
    /// (when, whose client).
    pub silenced: Vec<(Micros, usize)>,
    /// Switches of primary the clients learned of: (when, whose client,
    /// the lock names the switch concerns).
    pub learned: Vec<(Micros, usize, Vec<String>)>,
}

impl World {
    pub fn new(rng: Rng, net: NetParams, epoch_us: i64) -> World {
        World {
            start: Instant::now(),
            epoch_us,
            rng,
            net,
            nodes: Vec::new(),
            sentinels: Vec::new(),
            topology: None,
            addresses: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            by_node_conn: BTreeMap::new(),
            events: BTreeMap::new(),
            seq: 0,
            clients: Vec::new(),
            rec: crate::history::Recorder::default(),
            deploy: crate::deploy::DeployState::Node,
            lossy: Vec::new(),
            lossy_open: BTreeMap::new(),
            outages: BTreeMap::new(),
            outage_open: BTreeMap::new(),
            pauses: BTreeMap::new(),
            pause_open: BTreeMap::new(),
            stats: BTreeMap::new(),
            trace: false,
            scripts: BTreeMap::new(),
            renewal_created: Vec::new(),
            announced: Vec::new(),
            silenced: Vec::new(),
            learned: Vec::new(),
        }
    }

    /// Virtual µs since the run started.
    pub fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    /// The virtual time of a tokio instant.
    pub fn micros_of(&self, instant: Instant) -> Micros {
        if instant >= self.start {
            instant.duration_since(self.start).as_micros() as Micros
        } else {
            -(self.start.duration_since(instant).as_micros() as Micros)
        }
    }

    /// The tokio instant of virtual time `at`.
    pub fn instant(&self, at: Micros) -> Instant {
        self.start + Duration::from_micros(at.max(0) as u64)
    }

    /// The simulated wall clock (µs since the epoch) now, before any node's
    /// skew.
    pub fn wall_us(&self) -> i64 {
        self.epoch_us + self.now()
    }

    pub fn note(&mut self, text: impl Into<String>) {
        let at = self.now();
        self.rec.lines.push((at, text.into()));
    }

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    pub fn add_node(&mut self, node: Node, name: &str) -> usize {
        let at = self.nodes.len();
        self.addresses.insert(node.address(), Target::Node(at));
        self.nodes.push(NodeSlot {
            node,
            name: name.to_owned(),
            up: true,
            stalled: false,
            parked: VecDeque::new(),
            waits: Vec::new(),
            follows: None,
            link_up: true,
            needs_sync: false,
            repl_scheduled: false,
        });
        at
    }

    pub fn add_sentinel(&mut self, node: SentinelNode) -> usize {
        let at = self.sentinels.len();
        self.addresses.insert(node.address(), Target::Sentinel(at));
        self.sentinels.push(SentinelSlot { node, up: true });
        at
    }

    pub fn add_client(&mut self) -> usize {
        self.clients.push(ClientNet::default());
        self.clients.len() - 1
    }

    /// Makes `replica` follow `primary` (a full or partial resync first).
    pub fn follow(&mut self, replica: usize, primary: usize) {
        let (host, port) = {
            let config = self.nodes[primary].node.config();
            (config.host.clone(), config.port)
        };
        let (rhost, rport) = {
            let config = self.nodes[replica].node.config();
            (config.host.clone(), config.port)
        };
        if let Some(old) = self.nodes[replica].follows {
            if old != primary {
                self.nodes[old].node.detach_replica(&rhost, rport);
            }
        }
        self.nodes[replica].node.become_replica_of(&host, port);
        self.nodes[replica].follows = Some(primary);
        self.nodes[replica].needs_sync = true;
        self.nodes[replica].link_up = true;
        let acked = 0;
        self.nodes[primary]
            .node
            .attach_replica(&rhost, rport, acked);
        self.schedule_replication(replica);
        self.outage_changed(replica);
    }

    /// Makes `node` a primary (`REPLICAOF NO ONE`).
    pub fn promote(&mut self, node: usize) {
        if let Some(old) = self.nodes[node].follows.take() {
            let (host, port) = {
                let config = self.nodes[node].node.config();
                (config.host.clone(), config.port)
            };
            self.nodes[old].node.detach_replica(&host, port);
        }
        self.nodes[node].node.promote();
        self.outage_changed(node);
    }

    /// Whether a node answers now.
    pub fn available(&self, node: usize) -> bool {
        self.nodes[node].up && !self.nodes[node].stalled
    }

    /// Opens or closes `node`'s outage: an interval in which it does not
    /// answer lock commands (down, stalled, or a replica, which answers
    /// `MOVED`/`READONLY`), for the wrong-error checker.
    fn outage_changed(&mut self, node: usize) {
        let now = self.now();
        let available = self.available(node) && self.nodes[node].follows.is_none();
        match (available, self.outage_open.get(&node).copied()) {
            (false, None) => {
                self.outage_open.insert(node, now);
            }
            (true, Some(from)) => {
                self.outage_open.remove(&node);
                self.outages.entry(node).or_default().push((from, now));
            }
            _ => {}
        }
    }

    /// Closes the open outage and pause intervals at the run's end.
    pub fn close_intervals(&mut self, end: Micros) {
        for (node, from) in std::mem::take(&mut self.outage_open) {
            self.outages.entry(node).or_default().push((from, end));
        }
        for (client, from) in std::mem::take(&mut self.pause_open) {
            self.pauses.entry(client).or_default().push((from, end));
        }
    }

    // --- events ------------------------------------------------------------

    pub fn schedule(&mut self, at: Micros, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    pub fn schedule_action(&mut self, at: Micros, action: Action) {
        self.schedule(at, Event::Action(action));
    }

    fn next_due(&self) -> Option<Micros> {
        self.events.keys().next().map(|(at, _)| *at)
    }

    fn pop_due(&mut self, now: Micros) -> Option<Event> {
        let (&key, _) = self.events.iter().next()?;
        if key.0 > now {
            return None;
        }
        self.events.remove(&key)
    }

    /// A one-way delay drawn for a message.
    fn delay(&mut self) -> Micros {
        let net = &self.net;
        let (min, max, spike_per_mille, spike) =
            (net.min_us, net.max_us, net.spike_per_mille, net.spike_us);
        let mut delay = self.rng.range(min as u64, max as u64) as Micros;
        if spike_per_mille > 0 && self.rng.below(1000) < spike_per_mille {
            delay += self.rng.range(0, spike as u64) as Micros;
        }
        delay
    }

    /// The longest a message can take one way, spikes included.
    pub fn max_delay(&self) -> Micros {
        self.net.max_us
            + if self.net.spike_per_mille > 0 {
                self.net.spike_us
            } else {
                0
            }
    }

    fn silenced(&mut self, conn: u64) {
        let client = self.conns[&conn].client;
        let now = self.now();
        self.silenced.push((now, client));
        if self.trace {
            self.note(format!("net: c{client} conn {conn} stops answering"));
        }
    }

    pub fn connect_delay(&mut self) -> Duration {
        let there = self.delay();
        let back = self.delay();
        Duration::from_micros((there + back) as u64)
    }

    // --- connections -------------------------------------------------------

    /// Opens a connection of `client` to `address`, or refuses it.
    pub fn open(
        &mut self,
        client: usize,
        address: &str,
    ) -> RedisResult<(u64, mpsc::UnboundedReceiver<PushInfo>)> {
        let Some(&target) = self.addresses.get(address) else {
            return Err(refused());
        };
        let cmd = match target {
            Target::Node(n) => {
                if !self.nodes[n].up {
                    return Err(refused());
                }
                self.nodes[n].node.connect()
            }
            Target::Sentinel(s) => {
                if !self.sentinels[s].up {
                    return Err(refused());
                }
                self.sentinels[s].node.connect()
            }
        };
        self.next_conn += 1;
        let id = self.next_conn;
        let (sender, receiver) = mpsc::unbounded_channel();
        let now = self.now();
        self.conns.insert(
            id,
            ConnState {
                client,
                target,
                cmd,
                sub: None,
                broken: false,
                silent: false,
                closing: false,
                last_up: now,
                last_down: now,
                pushes: Some(sender),
                blocked: None,
                queued: VecDeque::new(),
            },
        );
        self.by_node_conn.insert((target, cmd), id);
        self.count("connections");
        Ok((id, receiver))
    }

    /// The client sends `commands` on connection `id`.
    pub fn send(
        &mut self,
        id: u64,
        commands: Vec<Vec<Vec<u8>>>,
        reply: oneshot::Sender<RedisResult<Vec<Value>>>,
    ) {
        let Some(state) = self.conns.get(&id) else {
            let _ = reply.send(Err(reset()));
            return;
        };
        if state.broken {
            let _ = reply.send(Err(reset()));
            return;
        }
        if state.silent {
            return; // nothing comes back on it
        }
        let client = state.client;
        if self.clients[client].paused {
            self.clients[client].outbox.push((id, commands, reply));
            return;
        }
        self.count("requests");
        let now = self.now();
        let net = self.net.clone();
        if net.late_per_mille > 0 && self.rng.below(1000) < net.late_per_mille {
            // The write sits in a connection that then breaks; it reaches
            // the node much later, after the client has re-sent it.
            let late = now + self.delay() + self.rng.range(1, net.late_us as u64) as Micros;
            let target = self.conns[&id].target;
            self.schedule(late, Event::Late { target, commands });
            self.count("late requests");
            self.conns.get_mut(&id).expect("open").silent = true;
            self.silenced(id);
            return;
        }
        let delay = self.delay();
        let state = self.conns.get_mut(&id).expect("open");
        let arrive = (now + delay).max(state.last_up);
        state.last_up = arrive;
        let batch = Batch {
            commands,
            replies: Vec::new(),
            pushes: Vec::new(),
            next: 0,
            reply: Some(reply),
        };
        if net.lost_reply_per_mille > 0 && self.rng.below(1000) < net.lost_reply_per_mille {
            // It arrives and runs; its reply, and everything after, is lost.
            let mut batch = batch;
            batch.reply = None;
            self.schedule(arrive, Event::Arrive { conn: id, batch });
            self.conns.get_mut(&id).expect("open").silent = true;
            self.silenced(id);
            self.count("lost replies");
            return;
        }
        self.schedule(arrive, Event::Arrive { conn: id, batch });
    }

    /// The client dropped connection `id`.
    pub fn close(&mut self, id: u64) {
        let now = self.now();
        let Some(state) = self.conns.get_mut(&id) else {
            return;
        };
        state.closing = true;
        let at = (now + 1).max(state.last_up);
        self.schedule(at, Event::Close { conn: id });
    }

    fn disconnect_node_side(&mut self, state: &ConnState) {
        let conns = [Some(state.cmd), state.sub];
        for conn in conns.into_iter().flatten() {
            self.by_node_conn.remove(&(state.target, conn));
            match state.target {
                Target::Node(n) => {
                    if self.nodes[n].node.is_connected(conn) {
                        self.nodes[n].node.disconnect(conn);
                    }
                }
                Target::Sentinel(s) => {
                    if self.sentinels[s].node.is_connected(conn) {
                        self.sentinels[s].node.disconnect(conn);
                    }
                }
            }
        }
    }

    /// Breaks connection `id`: pending calls fail, pushes end.
    fn break_conn(&mut self, id: u64) {
        let Some(state) = self.conns.get_mut(&id) else {
            return;
        };
        if state.broken {
            return;
        }
        state.broken = true;
        state.pushes = None;
        let blocked: Vec<Batch> = state
            .blocked
            .take()
            .into_iter()
            .chain(state.queued.drain(..))
            .collect();
        for mut batch in blocked {
            if let Some(reply) = batch.reply.take() {
                let _ = reply.send(Err(reset()));
            }
        }
    }

    // --- the driver's steps -----------------------------------------------

    fn process(&mut self, event: Event) {
        match event {
            Event::Arrive { conn, batch } => self.arrive(conn, batch),
            Event::Late { target, commands } => self.late(target, commands),
            Event::Close { conn } => {
                if let Some(state) = self.conns.remove(&conn) {
                    if !state.broken {
                        self.disconnect_node_side(&state);
                    }
                    for mut batch in state.blocked.into_iter().chain(state.queued) {
                        if let Some(reply) = batch.reply.take() {
                            let _ = reply.send(Err(reset()));
                        }
                    }
                    if let Target::Node(n) = state.target {
                        self.nodes[n].waits.retain(|(c, _)| *c != conn);
                    }
                }
            }
            Event::Reply {
                conn,
                reply,
                result,
            } => {
                let Some(state) = self.conns.get(&conn) else {
                    let _ = reply.send(Err(reset()));
                    return;
                };
                let client = state.client;
                if self.clients[client].paused {
                    self.clients[client].inbox.push(Event::Reply {
                        conn,
                        reply,
                        result,
                    });
                    return;
                }
                if state.broken {
                    let _ = reply.send(Err(reset()));
                } else if !state.silent {
                    let _ = reply.send(result);
                }
            }
            Event::Push { conn, push } => {
                let Some(state) = self.conns.get(&conn) else {
                    return;
                };
                let client = state.client;
                if self.clients[client].paused {
                    self.clients[client].inbox.push(Event::Push { conn, push });
                    return;
                }
                if !state.silent {
                    if let Some(pushes) = &state.pushes {
                        let _ = pushes.send(push);
                    }
                }
            }
            Event::Replicate { replica } => self.replicate(replica),
            Event::WaitTimeout { node, conn } => self.wait_timeout(node, conn),
            Event::Relay { node, publication } => {
                if self.available(node) {
                    let deliveries = self.nodes[node].node.deliver(&publication);
                    self.deliver(Target::Node(node), deliveries);
                }
            }
            Event::Action(action) => self.act(action),
        }
    }

    fn arrive(&mut self, conn: u64, batch: Batch) {
        let Some(state) = self.conns.get(&conn) else {
            return;
        };
        if state.broken {
            let mut batch = batch;
            if let Some(reply) = batch.reply.take() {
                let _ = reply.send(Err(reset()));
            }
            return;
        }
        match state.target {
            Target::Node(n) => {
                if !self.nodes[n].up {
                    self.break_conn(conn);
                    let mut batch = batch;
                    if let Some(reply) = batch.reply.take() {
                        let _ = reply.send(Err(reset()));
                    }
                    return;
                }
                if self.nodes[n].stalled {
                    if self.trace {
                        let client = self.conns.get(&conn).map_or(0, |state| state.client);
                        let summary: Vec<String> = batch
                            .commands
                            .iter()
                            .map(|command| self.summary(command))
                            .collect();
                        let text = format!(
                            "net: c{client} conn {conn} -> {} (stalled, parked): {}",
                            self.nodes[n].name,
                            summary.join(" | ")
                        );
                        self.note(text);
                    }
                    self.nodes[n].parked.push_back((conn, batch));
                    return;
                }
            }
            Target::Sentinel(s) => {
                if !self.sentinels[s].up {
                    self.break_conn(conn);
                    let mut batch = batch;
                    if let Some(reply) = batch.reply.take() {
                        let _ = reply.send(Err(reset()));
                    }
                    return;
                }
            }
        }
        let state = self.conns.get_mut(&conn).expect("open");
        if state.blocked.is_some() {
            state.queued.push_back(batch);
            return;
        }
        self.run_batch(conn, batch);
    }

    /// Runs the batch's commands from where it stopped; answers it, or
    /// leaves it blocked in a `WAIT`.
    fn run_batch(&mut self, conn: u64, mut batch: Batch) {
        while batch.next < batch.commands.len() {
            let command = batch.commands[batch.next].clone();
            batch.next += 1;
            let subscribing = is_subscribe(&command);
            let Some(executed) = self.execute(conn, &command, subscribing) else {
                // Its node's connection is gone (restarted): broken.
                self.break_conn(conn);
                if let Some(reply) = batch.reply.take() {
                    let _ = reply.send(Err(reset()));
                }
                return;
            };
            if subscribing {
                for value in std::iter::once(&executed.reply).chain(&executed.more_replies) {
                    if let Some(push) = to_push(value) {
                        batch.pushes.push(push);
                    }
                }
            }
            if let Some(wait) = executed.wait.clone() {
                let Target::Node(n) = self.conns[&conn].target else {
                    unreachable!("only data nodes block");
                };
                self.nodes[n].waits.push((conn, wait.clone()));
                if wait.timeout_ms > 0 {
                    let at = self.now() + wait.timeout_ms as Micros * 1000;
                    self.schedule(at, Event::WaitTimeout { node: n, conn });
                }
                let state = self.conns.get_mut(&conn).expect("open");
                state.blocked = Some(batch);
                return;
            }
            batch.replies.push(executed.reply);
        }
        self.answer(conn, batch);
    }

    /// Sends a finished batch's replies (after its pushes) back.
    fn answer(&mut self, conn: u64, mut batch: Batch) {
        let now = self.now();
        let delay = self.delay();
        let state = self.conns.get_mut(&conn).expect("open");
        let at = (now + delay).max(state.last_down);
        state.last_down = at;
        for push in std::mem::take(&mut batch.pushes) {
            self.schedule(at, Event::Push { conn, push });
        }
        if let Some(reply) = batch.reply.take() {
            let result = Ok(std::mem::take(&mut batch.replies));
            self.schedule(
                at,
                Event::Reply {
                    conn,
                    reply,
                    result,
                },
            );
        }
        // Batches queued behind a blocked one run now.
        while let Some(next) = self
            .conns
            .get_mut(&conn)
            .filter(|state| state.blocked.is_none())
            .and_then(|state| state.queued.pop_front())
        {
            self.run_batch(conn, next);
        }
    }

    /// One command on its node; `None` if the node's connection is gone.
    fn execute(&mut self, conn: u64, command: &[Vec<u8>], subscribing: bool) -> Option<Executed> {
        let now = self.now();
        let wall = self.epoch_us + now;
        let state = self.conns.get(&conn)?;
        let target = state.target;
        let node_conn = if subscribing {
            match state.sub {
                Some(sub) => sub,
                None => {
                    let sub = match target {
                        Target::Node(n) => {
                            let sub = self.nodes[n].node.connect();
                            self.nodes[n].node.execute(sub, &["HELLO", "3"], wall);
                            sub
                        }
                        Target::Sentinel(s) => {
                            let sub = self.sentinels[s].node.connect();
                            self.sentinels[s].node.execute(sub, &["HELLO", "3"]);
                            sub
                        }
                    };
                    self.by_node_conn.insert((target, sub), conn);
                    self.conns.get_mut(&conn).expect("open").sub = Some(sub);
                    sub
                }
            }
        } else {
            state.cmd
        };
        self.count("commands");
        let executed = match target {
            Target::Node(n) => {
                if !self.nodes[n].node.is_connected(node_conn) {
                    return None;
                }
                let before = self.nodes[n].node.replication_offset();
                // A renewal's keys that are gone before it runs.
                let gone: Vec<Vec<u8>> = if self.script_label(command).as_deref() == Some("RENEW") {
                    script_keys(command)
                        .filter(|key| self.nodes[n].node.get(0, key, wall).is_none())
                        .cloned()
                        .collect()
                } else {
                    Vec::new()
                };
                let executed = self.nodes[n].node.execute(node_conn, command, wall);
                if self.nodes[n].node.replication_offset() != before {
                    self.wrote(n);
                }
                for key in gone {
                    if self.nodes[n].node.get(0, &key, wall).is_some() {
                        let key = String::from_utf8_lossy(&key).into_owned();
                        let name = self.nodes[n].name.clone();
                        self.note(format!("{name}: a renewal brought back {key}"));
                        self.renewal_created.push((now, name, key));
                    }
                }
                executed
            }
            Target::Sentinel(s) => {
                if !self.sentinels[s].node.is_connected(node_conn) {
                    return None;
                }
                self.sentinels[s].node.execute(node_conn, command)
            }
        };
        if self.trace {
            let client = self.conns.get(&conn).map_or(0, |state| state.client);
            let to = match target {
                Target::Node(n) => self.nodes[n].name.clone(),
                Target::Sentinel(s) => format!("s{}", s + 1),
            };
            let text = format!(
                "net: c{client} conn {conn} -> {to}: {} => {}",
                self.summary(command),
                short(&format!("{:?}", executed.reply), 160)
            );
            self.note(text);
        }
        self.deliver(target, executed.deliveries.clone());
        if let Target::Node(n) = target {
            for publication in &executed.relay {
                self.relay(n, publication);
            }
        }
        Some(executed)
    }

    /// The name in the header of the script `command` runs (`EVAL`,
    /// `EVALSHA` of a script seen before), if any.
    fn script_label(&mut self, command: &[Vec<u8>]) -> Option<String> {
        let name = command.first()?;
        let sha = if name.eq_ignore_ascii_case(b"EVAL") {
            let source = String::from_utf8_lossy(command.get(1)?).into_owned();
            let sha = sha1_smol::Sha1::from(source.as_bytes())
                .digest()
                .to_string();
            if !self.scripts.contains_key(&sha) {
                let label = source
                    .lines()
                    .rfind(|line| {
                        line.starts_with("-- ")
                            && line[3..].split(':').next().is_some_and(|head| {
                                !head.is_empty()
                                    && head
                                        .chars()
                                        .all(|c| c.is_ascii_uppercase() || c == '_' || c == ' ')
                            })
                            && line.contains(':')
                    })
                    .map(|line| line[3..].split(':').next().unwrap_or("").to_owned())
                    .unwrap_or_else(|| "script".to_owned());
                self.scripts.insert(sha.clone(), label);
            }
            sha
        } else if name.eq_ignore_ascii_case(b"EVALSHA") {
            String::from_utf8_lossy(command.get(1)?).into_owned()
        } else {
            return None;
        };
        Some(
            self.scripts
                .get(&sha)
                .cloned()
                .unwrap_or_else(|| sha[..8.min(sha.len())].to_owned()),
        )
    }

    /// A command, shortly: a script by the name in its header.
    fn summary(&mut self, command: &[Vec<u8>]) -> String {
        let text = |arg: &Vec<u8>| String::from_utf8_lossy(arg).into_owned();
        if let Some(label) = self.script_label(command) {
            let name = text(&command[0]).to_ascii_uppercase();
            let rest: Vec<String> = command.iter().skip(2).map(text).collect();
            return short(&format!("{name} {label} {}", rest.join(" ")), 240);
        }
        let all: Vec<String> = command.iter().map(text).collect();
        short(&all.join(" "), 160)
    }

    /// A request that reaches `target` late, on a connection of its own.
    fn late(&mut self, target: Target, commands: Vec<Vec<Vec<u8>>>) {
        let Target::Node(n) = target else {
            return;
        };
        if !self.available(n) {
            return;
        }
        let wall = self.wall_us();
        let conn = self.nodes[n].node.connect();
        let before = self.nodes[n].node.replication_offset();
        for command in &commands {
            if is_subscribe(command) {
                continue;
            }
            let executed = self.nodes[n].node.execute(conn, command, wall);
            self.deliver(target, executed.deliveries.clone());
            for publication in &executed.relay {
                self.relay(n, publication);
            }
        }
        self.nodes[n].node.disconnect(conn);
        if self.nodes[n].node.replication_offset() != before {
            self.wrote(n);
        }
    }

    /// Pub/sub messages of `target` to the client connections they go to.
    fn deliver(&mut self, target: Target, deliveries: Vec<sim_redis::Delivery>) {
        for delivery in deliveries {
            let Some(&conn) = self.by_node_conn.get(&(target, delivery.conn)) else {
                continue;
            };
            let Some(push) = to_push(&delivery.value) else {
                continue;
            };
            let now = self.now();
            let delay = self.delay();
            let Some(state) = self.conns.get_mut(&conn) else {
                continue;
            };
            let at = (now + delay).max(state.last_down);
            state.last_down = at;
            self.schedule(at, Event::Push { conn, push });
        }
    }

    /// A sentinel's announcements to its subscribers.
    pub fn deliver_sentinel(&mut self, sentinel: usize, deliveries: Vec<sim_redis::Delivery>) {
        self.deliver(Target::Sentinel(sentinel), deliveries);
    }

    /// Deliveries a node makes by itself (a cluster's `sunsubscribe`s).
    pub fn deliver_from(&mut self, node: usize, deliveries: Vec<sim_redis::Delivery>) {
        self.deliver(Target::Node(node), deliveries);
    }

    /// A cluster relays a publication to its other nodes.
    fn relay(&mut self, from: usize, publication: &Publication) {
        if self.topology.is_none() {
            return;
        }
        for node in 0..self.nodes.len() {
            if node == from {
                continue;
            }
            let at = self.now() + self.delay();
            self.schedule(
                at,
                Event::Relay {
                    node,
                    publication: publication.clone(),
                },
            );
        }
    }

    // --- replication -------------------------------------------------------

    /// A primary wrote: its replicas get it after a replication delay.
    fn wrote(&mut self, primary: usize) {
        let replicas: Vec<usize> = (0..self.nodes.len())
            .filter(|&r| self.nodes[r].follows == Some(primary))
            .collect();
        for replica in replicas {
            self.schedule_replication(replica);
        }
    }

    pub fn schedule_replication(&mut self, replica: usize) {
        if self.nodes[replica].repl_scheduled {
            return;
        }
        self.nodes[replica].repl_scheduled = true;
        let delay = self
            .rng
            .range(self.net.repl_min_us as u64, self.net.repl_max_us as u64)
            as Micros;
        let at = self.now() + delay;
        self.schedule(at, Event::Replicate { replica });
    }

    fn replicate(&mut self, replica: usize) {
        self.nodes[replica].repl_scheduled = false;
        let Some(primary) = self.nodes[replica].follows else {
            return;
        };
        if !self.nodes[replica].link_up || !self.available(primary) || !self.available(replica) {
            return; // tried again when the link or the nodes come back
        }
        let now = self.wall_us();
        let (rhost, rport) = {
            let config = self.nodes[replica].node.config();
            (config.host.clone(), config.port)
        };
        let mut deliveries = Vec::new();
        let synced = if self.nodes[replica].needs_sync {
            None
        } else {
            self.nodes[primary]
                .node
                .entries_since(self.nodes[replica].node.replication_offset())
        };
        let mut resync = synced.is_none();
        if let Some(entries) = synced {
            for entry in entries {
                match self.nodes[replica].node.apply(&entry, now) {
                    Ok(delivered) => deliveries.extend(delivered),
                    Err(_gap) => {
                        resync = true;
                        break;
                    }
                }
            }
        }
        if resync {
            let sync = {
                let r = &self.nodes[replica].node;
                self.nodes[primary]
                    .node
                    .psync(r.replication_id(), r.replication_offset())
            };
            match self.nodes[replica].node.apply_sync(sync, now) {
                Ok(delivered) => deliveries.extend(delivered),
                Err(_) => {
                    // A continuation that did not fit: a full one.
                    let snapshot = sim_redis::Sync::Full(self.nodes[primary].node.snapshot());
                    let _ = self.nodes[replica].node.apply_sync(snapshot, now);
                }
            }
            self.nodes[replica].needs_sync = false;
            self.count("resyncs");
        }
        self.deliver(Target::Node(replica), deliveries);
        let offset = self.nodes[replica].node.replication_offset();
        self.nodes[primary]
            .node
            .replica_acked(&rhost, rport, offset);
        self.answer_waits(primary);
        if self.nodes[primary].node.replication_offset() > offset {
            self.schedule_replication(replica);
        }
    }

    fn answer_waits(&mut self, node: usize) {
        let waits = std::mem::take(&mut self.nodes[node].waits);
        for (conn, wait) in waits {
            if self.nodes[node].node.wait_satisfied(&wait) {
                self.finish_wait(node, conn, &wait);
            } else {
                self.nodes[node].waits.push((conn, wait));
            }
        }
    }

    fn wait_timeout(&mut self, node: usize, conn: u64) {
        if !self.available(node) {
            // A stalled node answers when it resumes; keep it for then.
            if self.nodes[node].stalled {
                let at = self.now() + 1000;
                self.schedule(at, Event::WaitTimeout { node, conn });
            }
            return;
        }
        let Some(at) = self.nodes[node].waits.iter().position(|(c, _)| *c == conn) else {
            return;
        };
        let (conn, wait) = self.nodes[node].waits.remove(at);
        self.finish_wait(node, conn, &wait);
    }

    fn finish_wait(&mut self, node: usize, conn: u64, wait: &WaitRequest) {
        let value = self.nodes[node].node.wait_reply(wait);
        let Some(state) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(mut batch) = state.blocked.take() else {
            return;
        };
        batch.replies.push(value);
        self.run_batch(conn, batch);
    }

    // --- faults ------------------------------------------------------------

    pub fn act(&mut self, action: Action) {
        match action {
            Action::Stall(n) => {
                self.nodes[n].stalled = true;
                self.note(format!("fault: {} stalled", self.nodes[n].name));
                self.outage_changed(n);
                crate::deploy::unavailable(self, n);
            }
            Action::Resume(n) => {
                if !self.nodes[n].stalled {
                    return;
                }
                self.nodes[n].stalled = false;
                self.note(format!("fault: {} resumed", self.nodes[n].name));
                self.outage_changed(n);
                let parked = std::mem::take(&mut self.nodes[n].parked);
                for (conn, batch) in parked {
                    self.arrive(conn, batch);
                }
                self.answer_waits(n);
                self.kick_replication(n);
            }
            Action::Kill(n) => {
                if !self.nodes[n].up {
                    return;
                }
                self.nodes[n].up = false;
                self.nodes[n].stalled = false;
                self.note(format!("fault: {} killed", self.nodes[n].name));
                self.outage_changed(n);
                crate::deploy::unavailable(self, n);
                let conns: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, state)| state.target == Target::Node(n))
                    .map(|(id, _)| *id)
                    .collect();
                for id in conns {
                    self.break_conn(id);
                }
                for (_, mut batch) in std::mem::take(&mut self.nodes[n].parked) {
                    if let Some(reply) = batch.reply.take() {
                        let _ = reply.send(Err(reset()));
                    }
                }
                self.nodes[n].waits.clear();
            }
            Action::Restart(n) => {
                if self.nodes[n].up {
                    return;
                }
                self.nodes[n].node.restart_empty();
                self.nodes[n].up = true;
                if self.nodes[n].follows.is_none() {
                    // A primary's data is gone: every lock it had.
                    let now = self.now();
                    let from = self.outage_open.get(&n).copied().unwrap_or(now);
                    self.lossy.push((from, now));
                }
                self.note(format!("fault: {} restarted empty", self.nodes[n].name));
                self.outage_changed(n);
                if self.nodes[n].follows.is_some() {
                    // A replica comes back as a replica (its configuration).
                    let primary = self.nodes[n].follows.expect("follows");
                    self.follow(n, primary);
                } else {
                    // Its replicas must resynchronise from a new history.
                    let replicas: Vec<usize> = (0..self.nodes.len())
                        .filter(|&r| self.nodes[r].follows == Some(n))
                        .collect();
                    for r in replicas {
                        self.follow(r, n);
                    }
                }
            }
            Action::PauseClient(c) => {
                if self.clients[c].paused {
                    return;
                }
                self.clients[c].paused = true;
                self.note(format!("fault: client c{c} paused"));
                let now = self.now();
                self.pause_open.insert(c, now);
            }
            Action::ResumeClient(c) => {
                if !self.clients[c].paused {
                    return;
                }
                self.clients[c].paused = false;
                self.note(format!("fault: client c{c} resumed"));
                if let Some(from) = self.pause_open.remove(&c) {
                    let now = self.now();
                    self.pauses.entry(c).or_default().push((from, now));
                }
                let now = self.now();
                for event in std::mem::take(&mut self.clients[c].inbox) {
                    self.schedule(now, event);
                }
                for (id, commands, reply) in std::mem::take(&mut self.clients[c].outbox) {
                    self.send(id, commands, reply);
                }
            }
            Action::Cut(c, n) => {
                self.note(format!(
                    "fault: client c{c}'s connections to {} cut",
                    self.nodes[n].name
                ));
                let conns: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, state)| state.client == c && state.target == Target::Node(n))
                    .map(|(id, _)| *id)
                    .collect();
                for id in conns {
                    if let Some(state) = self.conns.get(&id) {
                        let state = ConnState {
                            client: state.client,
                            target: state.target,
                            cmd: state.cmd,
                            sub: state.sub,
                            broken: true,
                            silent: false,
                            closing: false,
                            last_up: 0,
                            last_down: 0,
                            pushes: None,
                            blocked: None,
                            queued: VecDeque::new(),
                        };
                        self.disconnect_node_side(&state);
                    }
                    self.break_conn(id);
                }
            }
            Action::Link(r, up) => {
                self.nodes[r].link_up = up;
                self.note(format!(
                    "fault: {}'s replication link {}",
                    self.nodes[r].name,
                    if up { "restored" } else { "cut" }
                ));
                if up {
                    self.schedule_replication(r);
                }
            }
            Action::CalmNetwork => {
                self.net.lost_reply_per_mille = 0;
                self.net.late_per_mille = 0;
                self.net.spike_per_mille = 0;
                self.note("fault: the network is calm from now on");
            }
            other => crate::deploy::act(self, other),
        }
    }

    /// Replication involving `node` goes on (it resumed).
    fn kick_replication(&mut self, node: usize) {
        let involved: Vec<usize> = (0..self.nodes.len())
            .filter(|&r| {
                r == node && self.nodes[r].follows.is_some() || self.nodes[r].follows == Some(node)
            })
            .collect();
        for r in involved {
            self.schedule_replication(r);
        }
    }

    /// Every node, as `(name, keys alive now)`, for the checkers.
    pub fn live_keys(&self, node: usize) -> Vec<(Vec<u8>, Option<i64>)> {
        let now = self.wall_us();
        let mut keys = Vec::new();
        for key in self.nodes[node].node.keys(0, now) {
            let entry = self.nodes[node].node.get(0, &key, now);
            keys.push((key, entry.and_then(|entry| entry.expire_ms)));
        }
        keys
    }

    /// Drops what the run keeps (connections' channels) before the runtime
    /// goes: nothing more is delivered.
    pub fn shut(&mut self) {
        self.events.clear();
        for state in self.conns.values_mut() {
            state.pushes = None;
            state.blocked = None;
            state.queued.clear();
        }
        for slot in &mut self.nodes {
            slot.parked.clear();
        }
        for client in &mut self.clients {
            client.outbox.clear();
            client.inbox.clear();
        }
    }

    /// The set of deliveries' targets seen, for debugging.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    pub fn address_of(&self, node: usize) -> String {
        self.nodes[node].node.address()
    }

    pub fn names(&self) -> BTreeSet<String> {
        self.addresses.keys().cloned().collect()
    }
}

/// Runs the world's events as their instants come, for as long as the run
/// lasts.
pub async fn drive(shared: Arc<Shared>) {
    loop {
        let next = shared.quietly(|world| {
            let now = world.now();
            // Everything due, in order.
            let mut processed = 0;
            while let Some(event) = world.pop_due(now) {
                world.process(event);
                processed += 1;
            }
            let _ = processed;
            world.next_due().map(|at| world.instant(at))
        });
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// The keys of a script call (`EVAL`/`EVALSHA script numkeys key...`).
fn script_keys(command: &[Vec<u8>]) -> impl Iterator<Item = &Vec<u8>> {
    let count = command
        .get(2)
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    command.iter().skip(3).take(count)
}

fn is_subscribe(command: &[Vec<u8>]) -> bool {
    command
        .first()
        .map(|name| name.to_ascii_uppercase())
        .is_some_and(|name| name.ends_with(b"SUBSCRIBE"))
}

/// A message or confirmation as the client's connection pushes it.
fn to_push(value: &Value) -> Option<PushInfo> {
    match value {
        Value::Push { kind, data } => Some(PushInfo {
            kind: kind.clone(),
            data: data.clone(),
        }),
        Value::Array(items) => {
            let (first, rest) = items.split_first()?;
            let Value::BulkString(kind) = first else {
                return None;
            };
            let kind = match kind.to_ascii_lowercase().as_slice() {
                b"message" => PushKind::Message,
                b"smessage" => PushKind::SMessage,
                b"subscribe" => PushKind::Subscribe,
                b"ssubscribe" => PushKind::SSubscribe,
                b"unsubscribe" => PushKind::Unsubscribe,
                b"sunsubscribe" => PushKind::SUnsubscribe,
                _ => return None,
            };
            Some(PushInfo {
                kind,
                data: rest.to_vec(),
            })
        }
        _ => None,
    }
}

fn short(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn refused() -> RedisError {
    std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into()
}

fn reset() -> RedisError {
    std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()
}
