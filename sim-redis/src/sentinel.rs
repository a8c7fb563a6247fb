//! A simulated Redis Sentinel: answers what a client asks a sentinel
//! (`SENTINEL MASTER`, `SENTINEL GET-MASTER-ADDR-BY-NAME`, `PING`,
//! `SUBSCRIBE +switch-master`, `ROLE`) from the state the harness sets,
//! and announces a failover the harness decides (`+switch-master`). It
//! monitors nothing itself.

use std::collections::{BTreeMap, BTreeSet};

use redis::{PushKind, Value};

use crate::commands::is;
use crate::node::Executed;
use crate::pubsub::{ConnId, Delivery, Message, MessageKind, PubSub};
use crate::reply::{errors, Reply};

/// What a sentinel knows of one monitored master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterState {
    pub ip: String,
    pub port: u16,
    pub quorum: u32,
    pub config_epoch: u64,
    /// `master`, or with `s_down`, `o_down`, `failover_in_progress`...
    pub flags: String,
    pub num_slaves: u32,
    pub num_other_sentinels: u32,
}

impl MasterState {
    pub fn new(ip: impl Into<String>, port: u16) -> MasterState {
        MasterState {
            ip: ip.into(),
            port,
            quorum: 2,
            config_epoch: 0,
            flags: "master".to_owned(),
            num_slaves: 0,
            num_other_sentinels: 0,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct SentinelConn {
    resp3: bool,
    authenticated: bool,
    channels: BTreeSet<Vec<u8>>,
}

/// One simulated sentinel.
#[derive(Debug)]
pub struct SentinelNode {
    host: String,
    port: u16,
    password: Option<String>,
    masters: BTreeMap<String, MasterState>,
    conns: BTreeMap<ConnId, SentinelConn>,
    next_conn: u64,
    pubsub: PubSub,
}

/// The channel of a sentinel's failover announcement.
pub const SWITCH_MASTER: &str = "+switch-master";

impl SentinelNode {
    pub fn new(host: impl Into<String>, port: u16) -> SentinelNode {
        SentinelNode {
            host: host.into(),
            port,
            password: None,
            masters: BTreeMap::new(),
            conns: BTreeMap::new(),
            next_conn: 0,
            pubsub: PubSub::default(),
        }
    }

    /// A sentinel that wants `AUTH` (its `requirepass`).
    pub fn with_password(mut self, password: impl Into<String>) -> SentinelNode {
        self.password = Some(password.into());
        self
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Starts (or replaces) the monitoring of master `name`.
    pub fn monitor(&mut self, name: impl Into<String>, state: MasterState) {
        self.masters.insert(name.into(), state);
    }

    pub fn forget(&mut self, name: &str) {
        self.masters.remove(name);
    }

    pub fn master(&self, name: &str) -> Option<&MasterState> {
        self.masters.get(name)
    }

    pub fn master_mut(&mut self, name: &str) -> Option<&mut MasterState> {
        self.masters.get_mut(name)
    }

    /// A failover of `name` to `ip:port`: the state changes (a new config
    /// epoch) and the sentinel announces `+switch-master <name> <old ip>
    /// <old port> <new ip> <new port>` to its subscribers.
    ///
    /// Panics if the sentinel does not monitor `name`.
    pub fn switch_master(&mut self, name: &str, ip: &str, port: u16) -> Vec<Delivery> {
        let state = self
            .masters
            .get_mut(name)
            .unwrap_or_else(|| panic!("the sentinel does not monitor {name}"));
        let payload = format!("{name} {} {} {ip} {port}", state.ip, state.port);
        state.ip = ip.to_owned();
        state.port = port;
        state.config_epoch += 1;
        self.publish(SWITCH_MASTER.as_bytes(), payload.as_bytes())
    }

    /// Publishes any event on the sentinel's channels (`+sdown`...).
    pub fn publish(&mut self, channel: &[u8], payload: &[u8]) -> Vec<Delivery> {
        let message = Message {
            kind: MessageKind::Message,
            channel: channel.to_vec(),
            payload: payload.to_vec(),
        };
        self.pubsub
            .receivers(MessageKind::Message, channel)
            .into_iter()
            .filter_map(|conn| {
                let resp3 = self.conns.get(&conn)?.resp3;
                Some(Delivery {
                    conn,
                    value: message.to_value(resp3),
                    message: message.clone(),
                })
            })
            .collect()
    }

    pub fn connect(&mut self) -> ConnId {
        self.next_conn += 1;
        let id = ConnId(self.next_conn);
        self.conns.insert(
            id,
            SentinelConn {
                authenticated: self.password.is_none(),
                ..SentinelConn::default()
            },
        );
        id
    }

    pub fn disconnect(&mut self, conn: ConnId) {
        if let Some(state) = self.conns.remove(&conn) {
            for channel in state.channels {
                self.pubsub
                    .unsubscribe(MessageKind::Message, conn, &channel);
            }
        }
    }

    pub fn is_connected(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Restarted: connections closed (the monitored state is kept, as a
    /// sentinel's config file keeps it).
    pub fn restart(&mut self) {
        self.conns.clear();
        self.pubsub.clear();
    }

    /// Runs one command of `conn` (a sentinel has no clock of interest).
    ///
    /// Panics if `conn` is not open.
    pub fn execute<A: AsRef<[u8]>>(&mut self, conn: ConnId, args: &[A]) -> Executed {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_ref().to_vec()).collect();
        assert!(
            self.conns.contains_key(&conn),
            "sentinel connection {} is closed",
            conn.0
        );
        let mut more = Vec::new();
        let mut deliveries = Vec::new();
        let reply = self.dispatch(conn, &args, &mut more, &mut deliveries);
        let resp3 = self.conns[&conn].resp3;
        Executed {
            reply: reply.into_value(resp3),
            more_replies: more.into_iter().map(|r| r.into_value(resp3)).collect(),
            deliveries,
            relay: Vec::new(),
            wait: None,
            closed: false,
        }
    }

    fn dispatch(
        &mut self,
        conn: ConnId,
        args: &[Vec<u8>],
        more: &mut Vec<Reply>,
        deliveries: &mut Vec<Delivery>,
    ) -> Reply {
        let Some(name) = args.first() else {
            return Reply::err("ERR empty command");
        };
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let arity = |min: usize, exact: bool| {
            if (exact && args.len() != min) || args.len() < min {
                Some(Reply::Error(errors::arity(&name)))
            } else {
                None
            }
        };
        let known = [
            "ping",
            "sentinel",
            "subscribe",
            "unsubscribe",
            "publish",
            "role",
            "hello",
            "auth",
            "client",
            "info",
        ];
        if !known.contains(&name.as_str()) {
            return crate::commands::unknown_command(args);
        }
        if !self.conns[&conn].authenticated && name != "auth" && name != "hello" {
            return Reply::err(errors::NOAUTH);
        }
        let subscribed = !self.conns[&conn].channels.is_empty();
        if subscribed
            && !self.conns[&conn].resp3
            && !["ping", "subscribe", "unsubscribe"].contains(&name.as_str())
        {
            return Reply::Error(format!(
                "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context"
            ));
        }
        match name.as_str() {
            "ping" => {
                if subscribed && !self.conns[&conn].resp3 {
                    let said = args.get(1).cloned().unwrap_or_default();
                    return Reply::Array(vec![Reply::bulk(*b"pong"), Reply::Bulk(said)]);
                }
                match args.len() {
                    1 => Reply::Status("PONG".to_owned()),
                    2 => Reply::Bulk(args[1].clone()),
                    _ => Reply::Error(errors::arity("ping")),
                }
            }
            "sentinel" => arity(2, false).unwrap_or_else(|| self.sentinel(args)),
            "subscribe" => arity(2, false).unwrap_or_else(|| {
                let mut replies = Vec::new();
                for channel in &args[1..] {
                    let state = self.conns.get_mut(&conn).expect("open");
                    if state.channels.insert(channel.clone()) {
                        self.pubsub.subscribe(MessageKind::Message, conn, channel);
                    }
                    let count = state.channels.len();
                    replies.push(Reply::Push(
                        PushKind::Subscribe,
                        vec![Reply::Bulk(channel.clone()), Reply::Int(count as i64)],
                    ));
                }
                let mut replies = replies.into_iter();
                let first = replies.next().unwrap_or(Reply::Nil);
                more.extend(replies);
                first
            }),
            "unsubscribe" => {
                let channels: Vec<Vec<u8>> = if args.len() > 1 {
                    args[1..].to_vec()
                } else {
                    self.conns[&conn].channels.iter().cloned().collect()
                };
                if channels.is_empty() {
                    return Reply::Push(PushKind::Unsubscribe, vec![Reply::Nil, Reply::Int(0)]);
                }
                let mut replies = Vec::new();
                for channel in &channels {
                    let state = self.conns.get_mut(&conn).expect("open");
                    if state.channels.remove(channel) {
                        self.pubsub.unsubscribe(MessageKind::Message, conn, channel);
                    }
                    let count = state.channels.len();
                    replies.push(Reply::Push(
                        PushKind::Unsubscribe,
                        vec![Reply::Bulk(channel.clone()), Reply::Int(count as i64)],
                    ));
                }
                let mut replies = replies.into_iter();
                let first = replies.next().unwrap_or(Reply::Nil);
                more.extend(replies);
                first
            }
            "publish" => arity(3, true).unwrap_or_else(|| {
                // A sentinel accepts PUBLISH only on its hello channel.
                if args[1] != b"__sentinel__:hello" {
                    return Reply::err(
                        "ERR Only HELLO messages are accepted by Sentinel instances.",
                    );
                }
                let published = self.publish(&args[1], &args[2]);
                let count = published.len();
                deliveries.extend(published);
                Reply::Int(count as i64)
            }),
            "role" => Reply::Array(vec![
                Reply::bulk(*b"sentinel"),
                Reply::Array(
                    self.masters
                        .keys()
                        .map(|name| Reply::bulk(name.as_bytes()))
                        .collect(),
                ),
            ]),
            "hello" => self.hello(conn, args),
            "auth" => arity(2, false).unwrap_or_else(|| {
                let password = args.last().expect("arity checked");
                let user_ok = args.len() == 2 || args[1] == b"default";
                match &self.password {
                    Some(expected) if user_ok && expected.as_bytes() == password.as_slice() => {
                        self.conns.get_mut(&conn).expect("open").authenticated = true;
                        Reply::Ok
                    }
                    None if args.len() == 2 => Reply::err(
                        "ERR AUTH <password> called without any password configured for the \
                         default user. Are you sure your configuration is correct?",
                    ),
                    None if user_ok => Reply::Ok,
                    _ => Reply::err(errors::WRONGPASS),
                }
            }),
            "client" => arity(2, false).unwrap_or_else(|| {
                if is(&args[1], "setname") || is(&args[1], "setinfo") {
                    Reply::Ok
                } else if is(&args[1], "id") {
                    Reply::Int(conn.0 as i64)
                } else {
                    crate::commands::unknown_subcommand("client", &args[1])
                }
            }),
            "info" => Reply::Bulk(
                format!(
                    "# Server\r\nredis_version:{}\r\nredis_mode:sentinel\r\ntcp_port:{}\r\n\r\n\
                     # Sentinel\r\nsentinel_masters:{}\r\n",
                    crate::node::REDIS_VERSION,
                    self.port,
                    self.masters.len()
                )
                .into_bytes(),
            ),
            _ => unreachable!("checked against the known commands"),
        }
    }

    fn hello(&mut self, conn: ConnId, args: &[Vec<u8>]) -> Reply {
        let mut version = None;
        if let Some(arg) = args.get(1) {
            match crate::number::parse_i64(arg) {
                Some(v @ 2..=3) => version = Some(v),
                Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
                None => {
                    return Reply::err("ERR Protocol version is not an integer or out of range")
                }
            }
        }
        let mut j = 2;
        while j < args.len() {
            if is(&args[j], "auth") && j + 2 < args.len() {
                let ok = args[j + 1] == b"default"
                    && self
                        .password
                        .as_ref()
                        .is_none_or(|expected| expected.as_bytes() == args[j + 2].as_slice());
                if !ok {
                    return Reply::err(errors::WRONGPASS);
                }
                self.conns.get_mut(&conn).expect("open").authenticated = true;
                j += 3;
            } else if is(&args[j], "setname") && j + 1 < args.len() {
                j += 2;
            } else {
                return Reply::Error(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[j])
                ));
            }
        }
        if !self.conns[&conn].authenticated {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
                 HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
                 select the RESP protocol version at the same time",
            );
        }
        if let Some(version) = version {
            self.conns.get_mut(&conn).expect("open").resp3 = version == 3;
        }
        let proto = if self.conns[&conn].resp3 { 3 } else { 2 };
        Reply::Map(vec![
            (Reply::bulk(*b"server"), Reply::bulk(*b"redis")),
            (
                Reply::bulk(*b"version"),
                Reply::bulk(crate::node::REDIS_VERSION.as_bytes()),
            ),
            (Reply::bulk(*b"proto"), Reply::Int(proto)),
            (Reply::bulk(*b"id"), Reply::Int(conn.0 as i64)),
            (Reply::bulk(*b"mode"), Reply::bulk(*b"sentinel")),
            (Reply::bulk(*b"modules"), Reply::Array(Vec::new())),
        ])
    }

    fn master_reply(name: &str, state: &MasterState) -> Reply {
        let field = |k: &str, v: String| (Reply::bulk(k.as_bytes()), Reply::Bulk(v.into_bytes()));
        Reply::Map(vec![
            field("name", name.to_owned()),
            field("ip", state.ip.clone()),
            field("port", state.port.to_string()),
            field("runid", String::new()),
            field("flags", state.flags.clone()),
            field("link-pending-commands", "0".into()),
            field("link-refcount", "1".into()),
            field("last-ping-sent", "0".into()),
            field("last-ok-ping-reply", "0".into()),
            field("last-ping-reply", "0".into()),
            field("down-after-milliseconds", "30000".into()),
            field("info-refresh", "0".into()),
            field("role-reported", "master".into()),
            field("role-reported-time", "0".into()),
            field("config-epoch", state.config_epoch.to_string()),
            field("num-slaves", state.num_slaves.to_string()),
            field("num-other-sentinels", state.num_other_sentinels.to_string()),
            field("quorum", state.quorum.to_string()),
            field("failover-timeout", "180000".into()),
            field("parallel-syncs", "1".into()),
        ])
    }

    fn sentinel(&mut self, args: &[Vec<u8>]) -> Reply {
        let sub = &args[1];
        let no_such = || Reply::err("ERR No such master with that name");
        let name = args.get(2).map(|n| String::from_utf8_lossy(n).into_owned());
        if is(sub, "master") && args.len() == 3 {
            let name = name.expect("checked");
            match self.masters.get(&name) {
                Some(state) => Self::master_reply(&name, state),
                None => no_such(),
            }
        } else if is(sub, "masters") && args.len() == 2 {
            Reply::Array(
                self.masters
                    .iter()
                    .map(|(name, state)| Self::master_reply(name, state))
                    .collect(),
            )
        } else if is(sub, "get-master-addr-by-name") && args.len() == 3 {
            match self.masters.get(&name.expect("checked")) {
                Some(state) => Reply::Array(vec![
                    Reply::bulk(state.ip.as_bytes()),
                    Reply::Bulk(state.port.to_string().into_bytes()),
                ]),
                None => Reply::NilArray,
            }
        } else if (is(sub, "replicas") || is(sub, "slaves") || is(sub, "sentinels"))
            && args.len() == 3
        {
            match self.masters.get(&name.expect("checked")) {
                Some(_) => Reply::Array(Vec::new()),
                None => no_such(),
            }
        } else {
            Reply::Error(format!(
                "ERR unknown subcommand or wrong number of arguments for '{}'. Try SENTINEL HELP.",
                String::from_utf8_lossy(sub)
            ))
        }
    }
}

/// The value of a `+switch-master` message's payload, split:
/// `(name, old ip, old port, new ip, new port)`.
pub fn parse_switch_master(value: &Value) -> Option<(String, String, u16, String, u16)> {
    let payload = match value {
        Value::Array(items) if items.len() == 3 => &items[2],
        Value::Push { data, .. } if data.len() == 2 => &data[1],
        _ => return None,
    };
    let Value::BulkString(payload) = payload else {
        return None;
    };
    let text = String::from_utf8_lossy(payload);
    let parts: Vec<&str> = text.split(' ').collect();
    match parts.as_slice() {
        [name, old_ip, old_port, new_ip, new_port] => Some((
            (*name).to_owned(),
            (*old_ip).to_owned(),
            old_port.parse().ok()?,
            (*new_ip).to_owned(),
            new_port.parse().ok()?,
        )),
        _ => None,
    }
}
