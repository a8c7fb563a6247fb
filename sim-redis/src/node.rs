//! A simulated redis-server: [`Node`]. One call of [`Node::execute`] is one
//! command of one connection, run to its end at one instant of the node's
//! clock (scripts included: nothing else runs meanwhile).

use std::collections::{BTreeMap, BTreeSet};

use redis::{PushKind, Value};

use crate::commands::{self, is, Run, Spec, NOAUTH, NOSCRIPT, PUBSUB};
use crate::config::{Flavour, NodeConfig};
use crate::ctx::{Ctx, Outbox};
use crate::keyspace::{Clock, Db, Entry, ExpireMode};
use crate::lua::{self, LuaEngine, Outcome, ScriptFlags};
use crate::number::parse_i64;
use crate::pubsub::{ConnId, Delivery, Message, MessageKind, PubSub, Publication};
use crate::replication::{Gap, LinkState, ReplEntry, Replication, Role, Snapshot, Sync};
use crate::reply::{errors, Reply};

/// The version a node reports.
pub const REDIS_VERSION: &str = "7.0.15";

const DATABASES: usize = 16;

/// What one command did.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// The reply, as the `redis` crate parses it off a connection of the
    /// caller's protocol (RESP2 unless it sent `HELLO 3`). For a `WAIT`
    /// that blocks ([`Executed::wait`]) this is `Nil` and nothing is sent
    /// yet.
    pub reply: Value,
    /// Further replies to the same command, in order: `SUBSCRIBE a b`
    /// confirms each channel with a reply of its own.
    pub more_replies: Vec<Value>,
    /// Pub/sub messages for connections of this node (the caller's own
    /// included), in the order Redis sends them.
    pub deliveries: Vec<Delivery>,
    /// In a cluster: publishes the other nodes deliver too (see
    /// [`Publication`]).
    pub relay: Vec<Publication>,
    /// A `WAIT` that has to wait: the harness answers it later with
    /// [`Node::wait_reply`], when enough replicas acknowledged or at its
    /// timeout.
    pub wait: Option<WaitRequest>,
    /// The connection is closed after the reply (`QUIT`).
    pub closed: bool,
}

/// A blocked `WAIT numreplicas timeout`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitRequest {
    pub conn: ConnId,
    /// The replication offset of the connection's last write.
    pub offset: u64,
    /// How many replicas it waits for.
    pub replicas: usize,
    /// Its timeout in ms (0: none).
    pub timeout_ms: u64,
}

/// A connection's state.
#[derive(Clone, Debug)]
struct Conn {
    db: usize,
    resp3: bool,
    authenticated: bool,
    name: Option<Vec<u8>>,
    channels: BTreeSet<Vec<u8>>,
    shard_channels: BTreeSet<Vec<u8>>,
    readonly: bool,
    asking: bool,
    /// The replication offset after its last write (what `WAIT` waits for).
    woff: u64,
}

impl Conn {
    fn subscribed(&self) -> bool {
        !self.channels.is_empty() || !self.shard_channels.is_empty()
    }
}

/// One simulated redis-server.
pub struct Node {
    config: NodeConfig,
    skew_us: i64,
    dbs: Vec<Db>,
    pubsub: PubSub,
    lua: LuaEngine,
    conns: BTreeMap<ConnId, Conn>,
    next_conn: u64,
    repl: Replication,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field(
                "address",
                &format!("{}:{}", self.config.host, self.config.port),
            )
            .field("role", &self.repl.role)
            .field("offset", &self.repl.offset)
            .field("connections", &self.conns.len())
            .finish()
    }
}

/// The parts of a node a script's `redis.call` works on.
struct ScriptScope<'a> {
    dbs: &'a mut Vec<Db>,
    pubsub: &'a PubSub,
    config: &'a NodeConfig,
    replica: bool,
    clock: Clock,
    out: &'a mut Outbox,
    db: usize,
    read_only: bool,
    flags: ScriptFlags,
    dirty: bool,
    /// The slot of the keys touched so far (cluster).
    slot: Option<u16>,
}

impl Node {
    pub fn new(config: NodeConfig) -> Node {
        let seed = format!("{}:{}", config.host, config.port);
        let backlog = config.backlog_entries;
        Node {
            config,
            skew_us: 0,
            dbs: vec![Db::default(); DATABASES],
            pubsub: PubSub::default(),
            lua: LuaEngine::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            repl: Replication::new(seed, backlog),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.config.host, self.config.port)
    }

    /// How far the node's clock is ahead of the simulated clock (µs; may
    /// be negative).
    pub fn clock_skew_us(&self) -> i64 {
        self.skew_us
    }

    pub fn set_clock_skew_us(&mut self, skew_us: i64) {
        self.skew_us = skew_us;
    }

    /// The node's own time (µs) when the simulated clock reads `now_us`.
    pub fn local_time_us(&self, now_us: i64) -> i64 {
        now_us + self.skew_us
    }

    fn clock(&self, now_us: i64) -> Clock {
        Clock {
            now_us: self.local_time_us(now_us),
            mode: if self.repl.is_replica() {
                ExpireMode::Hide
            } else {
                ExpireMode::Delete
            },
        }
    }

    /// A new client connection (RESP2, database 0, not authenticated if
    /// the node has a password).
    pub fn connect(&mut self) -> ConnId {
        self.next_conn += 1;
        let id = ConnId(self.next_conn);
        self.conns.insert(
            id,
            Conn {
                db: 0,
                resp3: false,
                authenticated: self.config.password.is_none(),
                name: None,
                channels: BTreeSet::new(),
                shard_channels: BTreeSet::new(),
                readonly: false,
                asking: false,
                woff: 0,
            },
        );
        id
    }

    /// Closes a connection (its subscriptions end).
    pub fn disconnect(&mut self, conn: ConnId) {
        if let Some(state) = self.conns.remove(&conn) {
            for channel in &state.channels {
                self.pubsub.unsubscribe(MessageKind::Message, conn, channel);
            }
            for channel in &state.shard_channels {
                self.pubsub
                    .unsubscribe(MessageKind::SMessage, conn, channel);
            }
        }
    }

    pub fn is_connected(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// The connections, in order.
    pub fn connections(&self) -> Vec<ConnId> {
        self.conns.keys().copied().collect()
    }

    /// Restarts the node empty, as a redis-server without persistence
    /// does: no data, no scripts, no connections (every [`ConnId`] is
    /// closed), a new replication history, a primary. Its address, flavour,
    /// password, cluster place and clock skew stay.
    pub fn restart_empty(&mut self) {
        for db in self.dbs.iter_mut() {
            db.clear();
        }
        self.pubsub.clear();
        self.lua = LuaEngine::new();
        self.conns.clear();
        self.repl.reset();
    }

    /// Runs one command of `conn` at simulated time `now_us`.
    ///
    /// Panics if `conn` is not open (disconnected, or the node restarted).
    pub fn execute<A: AsRef<[u8]>>(&mut self, conn: ConnId, args: &[A], now_us: i64) -> Executed {
        let args: Vec<Vec<u8>> = args.iter().map(|arg| arg.as_ref().to_vec()).collect();
        assert!(
            self.conns.contains_key(&conn),
            "connection {} of {} is closed (disconnected, or the node restarted)",
            conn.0,
            self.address()
        );
        let clock = self.clock(now_us);
        let mut out = Outbox::default();
        let mut call = Call {
            conn,
            more: Vec::new(),
            wait: None,
            closed: false,
        };
        let reply = self.dispatch(&mut call, &args, clock, &mut out);
        let offset = self.repl.feed(std::mem::take(&mut out.effects));
        let resp3 = self.conns.get(&conn).is_some_and(|c| c.resp3);
        if let (Some(offset), Some(state)) = (offset, self.conns.get_mut(&conn)) {
            state.woff = offset;
        }
        let deliveries = self.deliveries(out.published);
        if call.closed {
            self.disconnect(conn);
        }
        Executed {
            reply: reply.into_value(resp3),
            more_replies: call
                .more
                .into_iter()
                .map(|reply| reply.into_value(resp3))
                .collect(),
            deliveries,
            relay: out.relay,
            wait: call.wait,
            closed: call.closed,
        }
    }

    fn deliveries(&self, published: Vec<(ConnId, Message)>) -> Vec<Delivery> {
        published
            .into_iter()
            .filter_map(|(conn, message)| {
                let resp3 = self.conns.get(&conn)?.resp3;
                Some(Delivery {
                    conn,
                    value: message.to_value(resp3),
                    message,
                })
            })
            .collect()
    }

    /// Delivers a publish relayed from another node of the cluster to this
    /// node's listeners (a shard message only to those of a shard channel).
    pub fn deliver(&mut self, publication: &Publication) -> Vec<Delivery> {
        let message = &publication.message;
        let published = self
            .pubsub
            .receivers(message.kind, &message.channel)
            .into_iter()
            .map(|conn| (conn, message.clone()))
            .collect();
        self.deliveries(published)
    }

    fn flavour_knows(&self, spec: &Spec) -> bool {
        match spec.name {
            "delifeq" => self.config.flavour == Flavour::Valkey9,
            "delex" => self.config.flavour == Flavour::Redis84,
            _ => true,
        }
    }

    /// `processCommand`: the checks before a command runs, then the run.
    fn dispatch(
        &mut self,
        call: &mut Call,
        args: &[Vec<u8>],
        clock: Clock,
        out: &mut Outbox,
    ) -> Reply {
        if args.is_empty() {
            return Reply::err("ERR empty command");
        }
        let Some(spec) = commands::lookup(&args[0]).filter(|spec| self.flavour_knows(spec)) else {
            return commands::unknown_command(args);
        };
        if !spec.arity_ok(args.len()) {
            return Reply::Error(errors::arity(spec.name));
        }
        let conn = &self.conns[&call.conn];
        if !conn.authenticated && !spec.has(NOAUTH) {
            return Reply::err(errors::NOAUTH);
        }
        let write = spec.is_write() || self.script_declares_write(spec, args);
        if let Some(refusal) = self.cluster_refusal(conn, spec, args, write) {
            return refusal;
        }
        if write && self.repl.is_replica() {
            return Reply::err(errors::READONLY);
        }
        if conn.subscribed() && !conn.resp3 && !spec.has(PUBSUB) {
            return Reply::Error(format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context",
                spec.name
            ));
        }
        match spec.run {
            Run::Data(handler) => {
                if spec.name == "ping" && conn.subscribed() && !conn.resp3 {
                    let said = args.get(1).cloned().unwrap_or_default();
                    return Reply::Array(vec![Reply::bulk(*b"pong"), Reply::Bulk(said)]);
                }
                let resp3 = conn.resp3;
                let cluster = self.config.cluster.is_some();
                let flavour = self.config.flavour;
                let conn = self.conns.get_mut(&call.conn).expect("checked above");
                let mut ctx = Ctx {
                    dbs: &mut self.dbs,
                    db: &mut conn.db,
                    clock,
                    pubsub: &self.pubsub,
                    out,
                    flavour,
                    cluster,
                    resp3,
                };
                commands::run_data(&mut ctx, handler, args)
            }
            Run::Node => self.node_command(call, spec, args, clock, out),
        }
    }

    /// Whether `EVAL`/`EVALSHA` runs a script whose shebang makes it a
    /// write command.
    fn script_declares_write(&self, spec: &Spec, args: &[Vec<u8>]) -> bool {
        match spec.name {
            "eval" | "eval_ro" => {
                lua::shebang(&args[1]).is_ok_and(|(flags, _)| flags.declared_write())
            }
            "evalsha" | "evalsha_ro" => {
                let sha = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
                self.lua
                    .script(&sha)
                    .is_some_and(|script| script.flags.declared_write())
            }
            _ => false,
        }
    }

    /// `getNodeByQuery`: in a cluster, whether this node serves the
    /// command's keys (or shard channels), else the redirection.
    fn cluster_refusal(
        &self,
        conn: &Conn,
        spec: &Spec,
        args: &[Vec<u8>],
        write: bool,
    ) -> Option<Reply> {
        let cluster = self.config.cluster.as_ref()?;
        let positions = spec.key_positions(args);
        let mut slot = None;
        for at in positions {
            let this = crate::cluster::key_slot(&args[at]);
            match slot {
                None => slot = Some(this),
                Some(first) if first != this => return Some(Reply::err(errors::CROSSSLOT)),
                Some(_) => {}
            }
        }
        let slot = slot?;
        let topology = cluster.topology.borrow();
        let Some(owner) = topology.owner(slot) else {
            return Some(Reply::err("CLUSTERDOWN Hash slot not served"));
        };
        if owner.id == cluster.node_id {
            return None;
        }
        let replica_of_owner = topology
            .node(&cluster.node_id)
            .is_some_and(|me| me.replica_of.as_deref() == Some(owner.id.as_str()));
        if replica_of_owner && (conn.readonly || spec.is_shard_pubsub()) && !write {
            return None;
        }
        Some(Reply::Error(format!(
            "MOVED {slot} {}:{}",
            owner.host, owner.port
        )))
    }

    fn node_command(
        &mut self,
        call: &mut Call,
        spec: &Spec,
        args: &[Vec<u8>],
        clock: Clock,
        out: &mut Outbox,
    ) -> Reply {
        match spec.name {
            "eval" => self.eval(call.conn, args, clock, out, false, false),
            "evalsha" => self.eval(call.conn, args, clock, out, true, false),
            "eval_ro" => self.eval(call.conn, args, clock, out, false, true),
            "evalsha_ro" => self.eval(call.conn, args, clock, out, true, true),
            "script" => self.script(args),
            "hello" => self.hello(call.conn, args),
            "auth" => self.auth(call.conn, args),
            "client" => self.client(call.conn, args),
            "subscribe" => self.subscribe(call, args, MessageKind::Message),
            "ssubscribe" => self.subscribe(call, args, MessageKind::SMessage),
            "unsubscribe" => self.unsubscribe(call, args, MessageKind::Message),
            "sunsubscribe" => self.unsubscribe(call, args, MessageKind::SMessage),
            "wait" => self.wait(call, args),
            "role" => self.role_reply(),
            "info" => self.info(args, clock),
            "cluster" => self.cluster_command(args),
            "readonly" | "readwrite" => {
                if self.config.cluster.is_none() {
                    return Reply::err("ERR This instance has cluster support disabled");
                }
                self.conn_mut(call.conn).readonly = spec.name == "readonly";
                Reply::Ok
            }
            "asking" => {
                if self.config.cluster.is_none() {
                    return Reply::err("ERR This instance has cluster support disabled");
                }
                self.conn_mut(call.conn).asking = true;
                Reply::Ok
            }
            "quit" => {
                call.closed = true;
                Reply::Ok
            }
            "reset" => {
                self.reset_conn(call.conn);
                Reply::Status("RESET".to_owned())
            }
            other => unreachable!("node command {other} without a handler"),
        }
    }

    fn conn_mut(&mut self, conn: ConnId) -> &mut Conn {
        self.conns.get_mut(&conn).expect("an open connection")
    }

    fn reset_conn(&mut self, conn: ConnId) {
        let state = self.conns[&conn].clone();
        for channel in &state.channels {
            self.pubsub.unsubscribe(MessageKind::Message, conn, channel);
        }
        for channel in &state.shard_channels {
            self.pubsub
                .unsubscribe(MessageKind::SMessage, conn, channel);
        }
        let authenticated = self.config.password.is_none();
        let state = self.conn_mut(conn);
        state.db = 0;
        state.resp3 = false;
        state.name = None;
        state.channels.clear();
        state.shard_channels.clear();
        state.readonly = false;
        state.asking = false;
        state.authenticated = authenticated;
    }

    // --- scripting -------------------------------------------------------

    fn eval(
        &mut self,
        conn: ConnId,
        args: &[Vec<u8>],
        clock: Clock,
        out: &mut Outbox,
        evalsha: bool,
        ro: bool,
    ) -> Reply {
        let Some(numkeys) = parse_i64(&args[2]) else {
            return Reply::err(errors::NOT_INTEGER);
        };
        if numkeys > (args.len() - 3) as i64 {
            return Reply::err("ERR Number of keys can't be greater than number of args");
        }
        if numkeys < 0 {
            return Reply::err("ERR Number of keys can't be negative");
        }
        let sha = if evalsha {
            let sha = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
            if sha.len() != 40 || !self.lua.exists(&sha) {
                return Reply::err(errors::NOSCRIPT);
            }
            sha
        } else {
            match self.lua.load(&args[1]) {
                Ok(sha) => sha,
                Err(error) => return error,
            }
        };
        let flags = self.lua.script(&sha).expect("loaded above").flags;
        let cluster = self.config.cluster.is_some();
        if flags.shebang {
            if flags.no_cluster && cluster {
                return Reply::err("ERR Can not run script on cluster, 'no-cluster' flag is set.");
            }
            if !flags.no_writes {
                if self.repl.is_replica() {
                    return Reply::err(
                        "READONLY Can not run script with write flag on readonly replica",
                    );
                }
                if ro {
                    return Reply::err(
                        "ERR Can not execute a script with write flag using *_ro command.",
                    );
                }
            }
        }
        let numkeys = numkeys as usize;
        let keys = &args[3..3 + numkeys];
        let argv = &args[3 + numkeys..];
        let declared_slot = if cluster {
            keys.first().map(|key| crate::cluster::key_slot(key))
        } else {
            None
        };
        let replica = self.repl.is_replica();
        let db = self.conns[&conn].db;
        let Node {
            lua,
            dbs,
            pubsub,
            config,
            ..
        } = self;
        let mut scope = ScriptScope {
            dbs,
            pubsub,
            config,
            replica,
            clock,
            out,
            db,
            read_only: ro || (flags.shebang && flags.no_writes),
            flags,
            dirty: false,
            slot: declared_slot,
        };
        let outcome = lua.run(&sha, keys, argv, &mut |argv| scope.call(argv));
        match outcome {
            Outcome::Reply(reply) | Outcome::Failed(reply) => reply,
        }
    }

    fn script(&mut self, args: &[Vec<u8>]) -> Reply {
        let sub = &args[1];
        if is(sub, "flush") {
            if args.len() > 3
                || (args.len() == 3 && !is(&args[2], "sync") && !is(&args[2], "async"))
            {
                return Reply::err("ERR SCRIPT FLUSH only support SYNC|ASYNC option");
            }
            self.lua.flush();
            Reply::Ok
        } else if is(sub, "exists") {
            Reply::Array(
                args[2..]
                    .iter()
                    .map(|sha| {
                        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
                        Reply::Int(self.lua.exists(&sha) as i64)
                    })
                    .collect(),
            )
        } else if is(sub, "load") && args.len() == 3 {
            match self.lua.load(&args[2]) {
                Ok(sha) => Reply::Bulk(sha.into_bytes()),
                Err(error) => error,
            }
        } else if is(sub, "kill") && args.len() == 2 {
            Reply::err("NOTBUSY No scripts in execution right now.")
        } else {
            commands::unknown_subcommand("script", sub)
        }
    }

    // --- connection ------------------------------------------------------

    fn role_name(&self) -> &'static str {
        if self.repl.is_replica() {
            "replica"
        } else {
            "master"
        }
    }

    /// Checks a user and password; `None` when they log in.
    fn refuse_login(&self, user: &[u8], password: &[u8]) -> Option<Reply> {
        if user != b"default" {
            return Some(Reply::err(errors::WRONGPASS));
        }
        match &self.config.password {
            None => None,
            Some(expected) if expected.as_bytes() == password => None,
            Some(_) => Some(Reply::err(errors::WRONGPASS)),
        }
    }

    fn hello(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Reply {
        let mut version = None;
        let mut next = 1;
        if args.len() >= 2 {
            match parse_i64(&args[1]) {
                Some(v @ 2..=3) => version = Some(v),
                Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
                None => {
                    return Reply::err("ERR Protocol version is not an integer or out of range")
                }
            }
            next = 2;
        }
        let mut login = None;
        let mut name = None;
        let mut j = next;
        while j < args.len() {
            let more = args.len() - 1 - j;
            if is(&args[j], "auth") && more >= 2 {
                login = Some((&args[j + 1], &args[j + 2]));
                j += 2;
            } else if is(&args[j], "setname") && more >= 1 {
                name = Some(&args[j + 1]);
                j += 1;
            } else {
                return Reply::Error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[j])
                ));
            }
            j += 1;
        }
        if let Some((user, password)) = login {
            if let Some(refusal) = self.refuse_login(user, password) {
                return refusal;
            }
            self.conn_mut(conn).authenticated = true;
        }
        if !self.conns[&conn].authenticated {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time",
            );
        }
        if let Some(name) = name {
            if let Err(error) = check_client_name(name) {
                return error;
            }
            self.conn_mut(conn).name = (!name.is_empty()).then(|| name.clone());
        }
        if let Some(version) = version {
            self.conn_mut(conn).resp3 = version == 3;
        }
        let proto = if self.conns[&conn].resp3 { 3 } else { 2 };
        let mode = if self.config.cluster.is_some() {
            "cluster"
        } else {
            "standalone"
        };
        Reply::Map(vec![
            (Reply::bulk(*b"server"), Reply::bulk(*b"redis")),
            (
                Reply::bulk(*b"version"),
                Reply::bulk(REDIS_VERSION.as_bytes()),
            ),
            (Reply::bulk(*b"proto"), Reply::Int(proto)),
            (Reply::bulk(*b"id"), Reply::Int(conn.0 as i64)),
            (Reply::bulk(*b"mode"), Reply::bulk(mode.as_bytes())),
            (
                Reply::bulk(*b"role"),
                Reply::bulk(self.role_name().as_bytes()),
            ),
            (Reply::bulk(*b"modules"), Reply::Array(Vec::new())),
        ])
    }

    fn auth(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Reply {
        if args.len() > 3 {
            return Reply::err(errors::SYNTAX);
        }
        let (user, password): (&[u8], &[u8]) = if args.len() == 2 {
            if self.config.password.is_none() {
                return Reply::err(
                    "ERR AUTH <password> called without any password configured for the default \
                     user. Are you sure your configuration is correct?",
                );
            }
            (b"default", &args[1])
        } else {
            (&args[1], &args[2])
        };
        if let Some(refusal) = self.refuse_login(user, password) {
            return refusal;
        }
        self.conn_mut(conn).authenticated = true;
        Reply::Ok
    }

    fn client(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Reply {
        let sub = &args[1];
        let arity = |name: &str| Reply::Error(errors::arity(&format!("client|{name}")));
        if is(sub, "setname") {
            if args.len() != 3 {
                return arity("setname");
            }
            if let Err(error) = check_client_name(&args[2]) {
                return error;
            }
            self.conn_mut(conn).name = (!args[2].is_empty()).then(|| args[2].clone());
            Reply::Ok
        } else if is(sub, "getname") {
            if args.len() != 2 {
                return arity("getname");
            }
            self.conns[&conn]
                .name
                .clone()
                .map_or(Reply::Nil, Reply::Bulk)
        } else if is(sub, "id") {
            if args.len() != 2 {
                return arity("id");
            }
            Reply::Int(conn.0 as i64)
        } else if is(sub, "setinfo") && self.config.flavour != Flavour::Redis7 {
            if args.len() != 4 {
                return arity("setinfo");
            }
            if !is(&args[2], "lib-name") && !is(&args[2], "lib-ver") {
                return Reply::Error(format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(&args[2])
                ));
            }
            Reply::Ok
        } else {
            commands::unknown_subcommand("client", sub)
        }
    }

    // --- pub/sub ---------------------------------------------------------

    fn subscription_reply(
        &self,
        conn: ConnId,
        kind: PushKind,
        channel: Option<&[u8]>,
        count: usize,
    ) -> Reply {
        let _ = conn;
        Reply::Push(
            kind,
            vec![
                channel.map_or(Reply::Nil, |c| Reply::Bulk(c.to_vec())),
                Reply::Int(count as i64),
            ],
        )
    }

    fn subscribe(&mut self, call: &mut Call, args: &[Vec<u8>], kind: MessageKind) -> Reply {
        let conn = call.conn;
        let mut replies = Vec::new();
        for channel in &args[1..] {
            let state = self.conns.get_mut(&conn).expect("an open connection");
            let (set, push) = match kind {
                MessageKind::Message => (&mut state.channels, PushKind::Subscribe),
                MessageKind::SMessage => (&mut state.shard_channels, PushKind::SSubscribe),
            };
            if set.insert(channel.clone()) {
                self.pubsub.subscribe(kind, conn, channel);
            }
            let count = set.len();
            replies.push(self.subscription_reply(conn, push, Some(channel), count));
        }
        first_and_more(call, replies)
    }

    fn unsubscribe(&mut self, call: &mut Call, args: &[Vec<u8>], kind: MessageKind) -> Reply {
        let conn = call.conn;
        let push = match kind {
            MessageKind::Message => PushKind::Unsubscribe,
            MessageKind::SMessage => PushKind::SUnsubscribe,
        };
        let state = &self.conns[&conn];
        let current = match kind {
            MessageKind::Message => &state.channels,
            MessageKind::SMessage => &state.shard_channels,
        };
        let channels: Vec<Vec<u8>> = if args.len() > 1 {
            args[1..].to_vec()
        } else {
            current.iter().cloned().collect()
        };
        if channels.is_empty() {
            let reply = self.subscription_reply(conn, push, None, 0);
            return reply;
        }
        let mut replies = Vec::new();
        for channel in &channels {
            let state = self.conns.get_mut(&conn).expect("an open connection");
            let set = match kind {
                MessageKind::Message => &mut state.channels,
                MessageKind::SMessage => &mut state.shard_channels,
            };
            if set.remove(channel) {
                self.pubsub.unsubscribe(kind, conn, channel);
            }
            let count = set.len();
            replies.push(self.subscription_reply(conn, push.clone(), Some(channel), count));
        }
        first_and_more(call, replies)
    }

    /// Ends the shard-channel subscriptions whose slot this node no longer
    /// serves (neither as the slot's primary nor as its replica), telling
    /// each connection with an `sunsubscribe`, as Redis 7.0 does when a
    /// slot moves away. Call it after changing the cluster topology.
    pub fn topology_changed(&mut self) -> Vec<Delivery> {
        let Some(cluster) = self.config.cluster.clone() else {
            return Vec::new();
        };
        let lost = {
            let topology = cluster.topology.borrow();
            let me = topology.node(&cluster.node_id).cloned();
            self.pubsub.shard_channels_where(|channel| {
                let slot = crate::cluster::key_slot(channel);
                match topology.owner(slot) {
                    None => true,
                    Some(owner) => {
                        owner.id != cluster.node_id
                            && me.as_ref().and_then(|me| me.replica_of.as_deref())
                                != Some(owner.id.as_str())
                    }
                }
            })
        };
        let mut deliveries = Vec::new();
        for (channel, conns) in lost {
            for conn in conns {
                self.pubsub
                    .unsubscribe(MessageKind::SMessage, conn, &channel);
                let Some(state) = self.conns.get_mut(&conn) else {
                    continue;
                };
                state.shard_channels.remove(&channel);
                let count = state.shard_channels.len();
                let resp3 = state.resp3;
                let value = Reply::Push(
                    PushKind::SUnsubscribe,
                    vec![Reply::Bulk(channel.clone()), Reply::Int(count as i64)],
                )
                .into_value(resp3);
                deliveries.push(Delivery {
                    conn,
                    message: Message {
                        kind: MessageKind::SMessage,
                        channel: channel.clone(),
                        payload: Vec::new(),
                    },
                    value,
                });
            }
        }
        deliveries
    }

    // --- replication -----------------------------------------------------

    fn wait(&mut self, call: &mut Call, args: &[Vec<u8>]) -> Reply {
        if self.repl.is_replica() {
            return Reply::err(
                "ERR WAIT cannot be used with replica instances. Please also note that since Redis \
                 4.0 if a replica is configured to be writable (which is not the default) writes to \
                 replicas are just local and are not propagated.",
            );
        }
        let Some(replicas) = parse_i64(&args[1]) else {
            return Reply::err(errors::NOT_INTEGER);
        };
        let timeout = match parse_i64(&args[2]) {
            None => return Reply::err("ERR timeout is not an integer or out of range"),
            Some(timeout) if timeout < 0 => return Reply::err("ERR timeout is negative"),
            Some(timeout) => timeout as u64,
        };
        let offset = self.conns[&call.conn].woff;
        let acked = self.repl.acked(offset);
        if acked as i64 >= replicas {
            return Reply::Int(acked as i64);
        }
        call.wait = Some(WaitRequest {
            conn: call.conn,
            offset,
            replicas: replicas as usize,
            timeout_ms: timeout,
        });
        Reply::Nil
    }

    /// How many replicas acknowledged `offset` or later.
    pub fn acked_replicas(&self, offset: u64) -> usize {
        self.repl.acked(offset)
    }

    /// Whether a blocked `WAIT` has its replicas now.
    pub fn wait_satisfied(&self, wait: &WaitRequest) -> bool {
        self.repl.acked(wait.offset) >= wait.replicas
    }

    /// The reply of a blocked `WAIT` now (at its timeout, or once
    /// satisfied): the number of replicas that acknowledged, shaped for
    /// its connection.
    pub fn wait_reply(&self, wait: &WaitRequest) -> Value {
        Value::Int(self.repl.acked(wait.offset) as i64)
    }

    pub fn role(&self) -> &Role {
        &self.repl.role
    }

    pub fn is_replica(&self) -> bool {
        self.repl.is_replica()
    }

    /// The replication id (40 hex characters).
    pub fn replication_id(&self) -> &str {
        &self.repl.replid
    }

    /// A primary's offset; a replica's processed offset.
    pub fn replication_offset(&self) -> u64 {
        self.repl.offset
    }

    /// The entries of the stream after `offset`, if the backlog still
    /// holds them all.
    pub fn entries_since(&self, offset: u64) -> Option<Vec<ReplEntry>> {
        self.repl.entries_since(offset)
    }

    /// A copy of the dataset at the current offset.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            replid: self.repl.replid.clone(),
            offset: self.repl.offset,
            dbs: self.dbs.clone(),
        }
    }

    /// A replica's `PSYNC replid offset`: the entries it lacks when this
    /// node's history continues its own, else a full resynchronisation.
    pub fn psync(&self, replid: &str, offset: u64) -> Sync {
        if self.repl.can_continue(replid, offset) {
            Sync::Continue {
                replid: self.repl.replid.clone(),
                entries: self.repl.entries_since(offset).unwrap_or_default(),
            }
        } else {
            Sync::Full(self.snapshot())
        }
    }

    /// Records a replica of this primary (by its address), with the
    /// offset it acknowledged so far.
    pub fn attach_replica(&mut self, host: &str, port: u16, acked: u64) {
        self.repl.replicas.insert((host.to_owned(), port), acked);
    }

    pub fn detach_replica(&mut self, host: &str, port: u16) {
        self.repl.replicas.remove(&(host.to_owned(), port));
    }

    /// A replica's `REPLCONF ACK <offset>`.
    pub fn replica_acked(&mut self, host: &str, port: u16, offset: u64) {
        if let Some(acked) = self.repl.replicas.get_mut(&(host.to_owned(), port)) {
            *acked = (*acked).max(offset);
        }
    }

    /// `REPLICAOF host port`: from now on this node follows that primary
    /// (its data stays until a full resynchronisation replaces it).
    pub fn become_replica_of(&mut self, host: &str, port: u16) {
        self.repl.follow(host.to_owned(), port);
    }

    /// `REPLICAOF NO ONE`: a replica becomes a primary, keeping its data
    /// and offset under a new replication id.
    pub fn promote(&mut self) {
        self.repl.promote();
    }

    /// Sets the state of a replica's link, as `ROLE` reports it.
    pub fn set_link_state(&mut self, state: LinkState) {
        if let Role::Replica { link, .. } = &mut self.repl.role {
            *link = state;
        }
    }

    /// Applies what a primary answered to this replica's `psync`; the link
    /// is then `connected`. Returns the messages delivered meanwhile.
    pub fn apply_sync(&mut self, sync: Sync, now_us: i64) -> Result<Vec<Delivery>, Gap> {
        let deliveries = match sync {
            Sync::Full(snapshot) => {
                self.dbs = snapshot.dbs;
                self.repl.loaded(snapshot.replid, snapshot.offset);
                Vec::new()
            }
            Sync::Continue { replid, entries } => {
                if replid != self.repl.replid {
                    let old = std::mem::replace(&mut self.repl.replid, replid);
                    self.repl.replid2 = Some((old, self.repl.offset));
                }
                let mut deliveries = Vec::new();
                for entry in &entries {
                    deliveries.extend(self.apply(entry, now_us)?);
                }
                deliveries
            }
        };
        self.set_link_state(LinkState::Connected);
        Ok(deliveries)
    }

    /// Applies one entry of the primary's stream (it must start at this
    /// replica's offset). Keys do not expire while it applies.
    pub fn apply(&mut self, entry: &ReplEntry, now_us: i64) -> Result<Vec<Delivery>, Gap> {
        if entry.start != self.repl.offset {
            return Err(Gap {
                expected: self.repl.offset,
                got: entry.start,
            });
        }
        let clock = Clock {
            now_us: self.local_time_us(now_us),
            mode: ExpireMode::Keep,
        };
        let mut out = Outbox::default();
        let mut db = entry.db;
        for argv in &entry.commands {
            let Some(spec) = argv.first().and_then(|name| commands::lookup(name)) else {
                continue;
            };
            if let Run::Data(handler) = spec.run {
                let mut ctx = Ctx {
                    dbs: &mut self.dbs,
                    db: &mut db,
                    clock,
                    pubsub: &self.pubsub,
                    out: &mut out,
                    flavour: self.config.flavour,
                    cluster: self.config.cluster.is_some(),
                    resp3: false,
                };
                commands::run_data(&mut ctx, handler, argv);
            }
        }
        self.repl.applied(entry);
        Ok(self.deliveries(out.published))
    }

    /// Active expiry: deletes every key whose time has passed (a primary
    /// only; its replicas get a `DEL` each). Redis does this in the
    /// background, ten times a second, by sampling. Returns how many.
    pub fn active_expire(&mut self, now_us: i64) -> usize {
        if self.repl.is_replica() {
            return 0;
        }
        let clock = self.clock(now_us);
        let mut deleted = 0;
        for db in 0..self.dbs.len() {
            for key in self.dbs[db].expired_keys(&clock) {
                self.dbs[db].remove(&key);
                deleted += 1;
                self.repl.feed(vec![crate::ctx::Effect {
                    db,
                    argv: vec![b"DEL".to_vec(), key],
                }]);
            }
        }
        deleted
    }

    // --- inspection ------------------------------------------------------

    /// The live entry of `key` in database `db` at simulated time `now_us`
    /// (nothing is deleted).
    pub fn get(&self, db: usize, key: &[u8], now_us: i64) -> Option<&Entry> {
        let clock = self.clock(now_us);
        self.dbs[db]
            .peek(key)
            .filter(|entry| !clock.expired(entry.expire_ms))
    }

    /// The live keys of database `db`, in byte order.
    pub fn keys(&self, db: usize, now_us: i64) -> Vec<Vec<u8>> {
        let clock = self.clock(now_us);
        self.dbs[db]
            .live(&clock)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Every key of database `db`, expired ones included, with its entry.
    pub fn raw_entries(&self, db: usize) -> Vec<(Vec<u8>, Entry)> {
        self.dbs[db]
            .raw_keys()
            .filter_map(|key| Some((key.clone(), self.dbs[db].peek(key)?.clone())))
            .collect()
    }

    // --- server information ----------------------------------------------

    fn role_reply(&self) -> Reply {
        match &self.repl.role {
            Role::Primary => Reply::Array(vec![
                Reply::bulk(*b"master"),
                Reply::Int(self.repl.offset as i64),
                Reply::Array(
                    self.repl
                        .replicas
                        .iter()
                        .map(|((host, port), acked)| {
                            Reply::Array(vec![
                                Reply::bulk(host.as_bytes()),
                                Reply::Bulk(port.to_string().into_bytes()),
                                Reply::Bulk(acked.to_string().into_bytes()),
                            ])
                        })
                        .collect(),
                ),
            ]),
            Role::Replica { host, port, link } => Reply::Array(vec![
                Reply::bulk(*b"slave"),
                Reply::bulk(host.as_bytes()),
                Reply::Int(i64::from(*port)),
                Reply::bulk(link.name().as_bytes()),
                Reply::Int(if *link == LinkState::Connected {
                    self.repl.offset as i64
                } else {
                    -1
                }),
            ]),
        }
    }

    fn info(&self, args: &[Vec<u8>], clock: Clock) -> Reply {
        let wanted: Vec<String> = args[1..]
            .iter()
            .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
            .collect();
        let all = wanted.is_empty()
            || wanted
                .iter()
                .any(|w| w == "all" || w == "everything" || w == "default");
        let want = |section: &str| all || wanted.iter().any(|w| w == section);
        let mut text = String::new();
        if want("server") {
            let mode = if self.config.cluster.is_some() {
                "cluster"
            } else {
                "standalone"
            };
            text.push_str(&format!(
                "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:{mode}\r\n\
                 tcp_port:{}\r\nrun_id:{}\r\n\r\n",
                self.config.port, self.repl.replid
            ));
        }
        if want("replication") {
            text.push_str("# Replication\r\n");
            match &self.repl.role {
                Role::Primary => {
                    text.push_str(&format!(
                        "role:master\r\nconnected_slaves:{}\r\n",
                        self.repl.replicas.len()
                    ));
                    for (i, ((host, port), acked)) in self.repl.replicas.iter().enumerate() {
                        text.push_str(&format!(
                            "slave{i}:ip={host},port={port},state=online,offset={acked},lag=0\r\n"
                        ));
                    }
                }
                Role::Replica { host, port, link } => {
                    let up = if *link == LinkState::Connected {
                        "up"
                    } else {
                        "down"
                    };
                    text.push_str(&format!(
                        "role:slave\r\nmaster_host:{host}\r\nmaster_port:{port}\r\n\
                         master_link_status:{up}\r\nslave_repl_offset:{}\r\nslave_read_only:1\r\n",
                        self.repl.offset
                    ));
                }
            }
            text.push_str(&format!(
                "master_replid:{}\r\nmaster_repl_offset:{}\r\n\r\n",
                self.repl.replid, self.repl.offset
            ));
        }
        if want("keyspace") {
            text.push_str("# Keyspace\r\n");
            for (i, db) in self.dbs.iter().enumerate() {
                let (keys, expires) = db.live(&clock).fold((0, 0), |(k, e), (_, entry)| {
                    (k + 1, e + entry.expire_ms.is_some() as usize)
                });
                if keys > 0 {
                    text.push_str(&format!(
                        "db{i}:keys={keys},expires={expires},avg_ttl=0\r\n"
                    ));
                }
            }
        }
        Reply::Bulk(text.into_bytes())
    }

    fn cluster_command(&self, args: &[Vec<u8>]) -> Reply {
        let Some(cluster) = &self.config.cluster else {
            return Reply::err("ERR This instance has cluster support disabled");
        };
        let sub = &args[1];
        if is(sub, "slots") && args.len() == 2 {
            cluster.topology.borrow().slots_reply()
        } else if is(sub, "myid") && args.len() == 2 {
            Reply::bulk(cluster.node_id.as_bytes())
        } else if is(sub, "keyslot") && args.len() == 3 {
            Reply::Int(i64::from(crate::cluster::key_slot(&args[2])))
        } else if is(sub, "info") && args.len() == 2 {
            let topology = cluster.topology.borrow();
            let assigned = (0..crate::cluster::SLOTS)
                .filter(|slot| topology.owner(*slot).is_some())
                .count();
            let state = if assigned == crate::cluster::SLOTS as usize {
                "ok"
            } else {
                "fail"
            };
            Reply::Bulk(
                format!(
                    "cluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\n\
                     cluster_known_nodes:{}\r\n",
                    topology.nodes().len()
                )
                .into_bytes(),
            )
        } else {
            commands::unknown_subcommand("cluster", sub)
        }
    }
}

/// The state of one `execute` beyond its reply.
struct Call {
    conn: ConnId,
    more: Vec<Reply>,
    wait: Option<WaitRequest>,
    closed: bool,
}

/// The first of several replies, the others kept for `more_replies`.
fn first_and_more(call: &mut Call, replies: Vec<Reply>) -> Reply {
    let mut replies = replies.into_iter();
    let first = replies.next().unwrap_or(Reply::Nil);
    call.more.extend(replies);
    first
}

/// Redis's rule for client names: no spaces, newlines or other special
/// characters.
fn check_client_name(name: &[u8]) -> Result<(), Reply> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(Reply::err(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

impl ScriptScope<'_> {
    /// `scriptCall`: the checks Redis makes on a command of a script, then
    /// the command.
    fn call(&mut self, argv: Vec<Vec<u8>>) -> Reply {
        let spec = commands::lookup(&argv[0]).filter(|spec| match spec.name {
            "delifeq" => self.config.flavour == Flavour::Valkey9,
            "delex" => self.config.flavour == Flavour::Redis84,
            _ => true,
        });
        let Some(spec) = spec else {
            return Reply::err("ERR Unknown Redis command called from script");
        };
        if !spec.arity_ok(argv.len()) {
            return Reply::err("ERR Wrong number of args calling Redis command from script");
        }
        let handler = match spec.run {
            Run::Data(handler) if !spec.has(NOSCRIPT) => handler,
            _ => return Reply::err("ERR This Redis command is not allowed from script"),
        };
        let may_replicate = matches!(spec.name, "publish" | "spublish");
        if self.read_only && (spec.is_write() || may_replicate) {
            return Reply::err("ERR Write commands are not allowed from read-only scripts.");
        }
        if spec.is_write() && !self.dirty && self.replica {
            return Reply::err(errors::READONLY);
        }
        if spec.is_write() {
            self.dirty = true;
        }
        if let Some(cluster) = &self.config.cluster {
            let mut slot = None;
            let mut cross = false;
            for at in spec.key_positions(&argv) {
                let this = crate::cluster::key_slot(&argv[at]);
                match slot {
                    None => slot = Some(this),
                    Some(first) if first != this => cross = true,
                    Some(_) => {}
                }
            }
            if let Some(slot) = slot {
                let topology = cluster.topology.borrow();
                let local = topology.owner(slot).is_some_and(|owner| {
                    owner.id == cluster.node_id
                        || (!spec.is_write()
                            && topology
                                .node(&cluster.node_id)
                                .and_then(|me| me.replica_of.as_deref())
                                == Some(owner.id.as_str()))
                });
                if cross || !local {
                    return Reply::err(
                        "ERR Script attempted to access a non local key in a cluster node",
                    );
                }
                if !self.flags.cross_slot() {
                    match self.slot {
                        None => self.slot = Some(slot),
                        Some(first) if first != slot => return Reply::err(
                            "ERR Script attempted to access keys that do not hash to the same slot",
                        ),
                        Some(_) => {}
                    }
                }
            }
        }
        let mut ctx = Ctx {
            dbs: self.dbs,
            db: &mut self.db,
            clock: self.clock,
            pubsub: self.pubsub,
            out: self.out,
            flavour: self.config.flavour,
            cluster: self.config.cluster.is_some(),
            resp3: false,
        };
        commands::run_data(&mut ctx, handler, &argv)
    }
}
