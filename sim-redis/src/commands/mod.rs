//! The command table (names, arities, flags, key positions) and the data
//! commands, by type. Connection, scripting, replication and cluster
//! commands are marked [`Run::Node`]: the node runs them itself
//! (`node.rs`), with the state they need.

mod hashes;
mod keys;
mod lists;
mod server;
mod strings;
mod zsets;

use crate::ctx::Ctx;
use crate::number::parse_i64;
use crate::reply::{errors, Reply};

/// A data command: runs on the keyspace through a [`Ctx`].
pub(crate) type Handler = fn(&mut Ctx, &[Vec<u8>]) -> Reply;

/// Who runs a command.
#[derive(Clone, Copy)]
pub(crate) enum Run {
    Data(Handler),
    /// The node itself (connection state, scripts, replication, cluster).
    Node,
}

/// Where a command's keys are, for the cluster's slot checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keys {
    None,
    /// Argument 1.
    First,
    /// Every argument from 1 on.
    All,
    /// `EVAL script numkeys key...`.
    Eval,
    /// Shard channels: argument 1 (`SPUBLISH`) or all (`SSUBSCRIBE`).
    ShardFirst,
    ShardAll,
}

pub(crate) const WRITE: u8 = 1;
/// Refused inside a script.
pub(crate) const NOSCRIPT: u8 = 2;
/// Allowed on a RESP2 connection in subscribed mode.
pub(crate) const PUBSUB: u8 = 4;
/// Allowed before authentication.
pub(crate) const NOAUTH: u8 = 8;

/// A command of the table.
pub(crate) struct Spec {
    /// Lowercase, as Redis names it in errors.
    pub(crate) name: &'static str,
    /// As in Redis's table: n exactly, -n at least n (the name counted).
    pub(crate) arity: i32,
    pub(crate) flags: u8,
    pub(crate) keys: Keys,
    pub(crate) run: Run,
}

impl Spec {
    pub(crate) fn is_write(&self) -> bool {
        self.flags & WRITE != 0
    }

    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn arity_ok(&self, argc: usize) -> bool {
        let argc = argc as i32;
        if self.arity > 0 {
            argc == self.arity
        } else {
            argc >= -self.arity
        }
    }

    /// The positions of the keys (or shard channels) in `args`.
    pub(crate) fn key_positions(&self, args: &[Vec<u8>]) -> Vec<usize> {
        match self.keys {
            Keys::None => Vec::new(),
            Keys::First | Keys::ShardFirst => vec![1],
            Keys::All | Keys::ShardAll => (1..args.len()).collect(),
            Keys::Eval => match args.get(2).and_then(|n| parse_i64(n)) {
                Some(n) if n > 0 && (n as usize) + 3 <= args.len() => (3..3 + n as usize).collect(),
                _ => Vec::new(),
            },
        }
    }

    pub(crate) fn is_shard_pubsub(&self) -> bool {
        matches!(self.keys, Keys::ShardFirst | Keys::ShardAll)
    }
}

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:ident, $run:expr) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: Keys::$keys,
            run: $run,
        }
    };
}

const N: Run = Run::Node;

/// Every command the simulator knows, sorted by name.
static TABLE: &[Spec] = &[
    spec!("asking", 1, 0, None, N),
    spec!("auth", -2, NOSCRIPT | NOAUTH, None, N),
    spec!("client", -2, NOSCRIPT, None, N),
    spec!("cluster", -2, 0, None, N),
    spec!("dbsize", 1, 0, None, Run::Data(keys::dbsize)),
    spec!("del", -2, WRITE, All, Run::Data(keys::del)),
    spec!("delex", -2, WRITE, First, Run::Data(strings::delex)),
    spec!("delifeq", 3, WRITE, First, Run::Data(strings::delifeq)),
    spec!("echo", 2, 0, None, Run::Data(server::echo)),
    spec!("eval", -3, NOSCRIPT, Eval, N),
    spec!("eval_ro", -3, NOSCRIPT, Eval, N),
    spec!("evalsha", -3, NOSCRIPT, Eval, N),
    spec!("evalsha_ro", -3, NOSCRIPT, Eval, N),
    spec!("exists", -2, 0, All, Run::Data(keys::exists)),
    spec!("expire", -3, WRITE, First, Run::Data(keys::expire)),
    spec!("expireat", -3, WRITE, First, Run::Data(keys::expireat)),
    spec!("flushall", -1, WRITE, None, Run::Data(keys::flushall)),
    spec!("flushdb", -1, WRITE, None, Run::Data(keys::flushdb)),
    spec!("get", 2, 0, First, Run::Data(strings::get)),
    spec!("hdel", -3, WRITE, First, Run::Data(hashes::hdel)),
    spec!("hello", -1, NOSCRIPT | NOAUTH, None, N),
    spec!("hget", 3, 0, First, Run::Data(hashes::hget)),
    spec!("hgetall", 2, 0, First, Run::Data(hashes::hgetall)),
    spec!("hlen", 2, 0, First, Run::Data(hashes::hlen)),
    spec!("hset", -4, WRITE, First, Run::Data(hashes::hset)),
    spec!("info", -1, 0, None, N),
    spec!("lindex", 3, 0, First, Run::Data(lists::lindex)),
    spec!("llen", 2, 0, First, Run::Data(lists::llen)),
    spec!("lpop", -2, WRITE, First, Run::Data(lists::lpop)),
    spec!("lpush", -3, WRITE, First, Run::Data(lists::lpush)),
    spec!("lrange", 4, 0, First, Run::Data(lists::lrange)),
    spec!("lrem", 4, WRITE, First, Run::Data(lists::lrem)),
    spec!("persist", 2, WRITE, First, Run::Data(keys::persist)),
    spec!("pexpire", -3, WRITE, First, Run::Data(keys::pexpire)),
    spec!("pexpireat", -3, WRITE, First, Run::Data(keys::pexpireat)),
    spec!("ping", -1, PUBSUB, None, Run::Data(server::ping)),
    spec!("pttl", 2, 0, First, Run::Data(keys::pttl)),
    spec!("publish", 3, 0, None, Run::Data(server::publish)),
    spec!("quit", -1, NOSCRIPT | PUBSUB | NOAUTH, None, N),
    spec!("readonly", 1, 0, None, N),
    spec!("readwrite", 1, 0, None, N),
    spec!("reset", 1, NOSCRIPT | PUBSUB | NOAUTH, None, N),
    spec!("role", 1, NOSCRIPT, None, N),
    spec!("rpop", -2, WRITE, First, Run::Data(lists::rpop)),
    spec!("rpush", -3, WRITE, First, Run::Data(lists::rpush)),
    spec!("scan", -2, 0, None, Run::Data(keys::scan)),
    spec!("script", -2, NOSCRIPT, None, N),
    spec!("select", 2, 0, None, Run::Data(server::select)),
    spec!("set", -3, WRITE, First, Run::Data(strings::set)),
    spec!("spublish", 3, 0, ShardFirst, Run::Data(server::spublish)),
    spec!("ssubscribe", -2, NOSCRIPT | PUBSUB, ShardAll, N),
    spec!("subscribe", -2, NOSCRIPT | PUBSUB, None, N),
    spec!("sunsubscribe", -1, NOSCRIPT | PUBSUB, ShardAll, N),
    spec!("time", 1, 0, None, Run::Data(server::time)),
    spec!("ttl", 2, 0, First, Run::Data(keys::ttl)),
    spec!("type", 2, 0, First, Run::Data(keys::type_of)),
    spec!("unlink", -2, WRITE, All, Run::Data(keys::del)),
    spec!("unsubscribe", -1, NOSCRIPT | PUBSUB, None, N),
    spec!("wait", 3, NOSCRIPT, None, N),
    spec!("zadd", -4, WRITE, First, Run::Data(zsets::zadd)),
    spec!("zcard", 2, 0, First, Run::Data(zsets::zcard)),
    spec!("zcount", 4, 0, First, Run::Data(zsets::zcount)),
    spec!("zrange", -4, 0, First, Run::Data(zsets::zrange)),
    spec!(
        "zrangebyscore",
        -4,
        0,
        First,
        Run::Data(zsets::zrangebyscore)
    ),
    spec!("zrem", -3, WRITE, First, Run::Data(zsets::zrem)),
    spec!(
        "zremrangebyscore",
        4,
        WRITE,
        First,
        Run::Data(zsets::zremrangebyscore)
    ),
    spec!("zscore", 3, 0, First, Run::Data(zsets::zscore)),
];

/// The command named `name` (any case), if the simulator knows it.
pub(crate) fn lookup(name: &[u8]) -> Option<&'static Spec> {
    if name.len() > 20 {
        return None;
    }
    let lower = name.to_ascii_lowercase();
    TABLE
        .binary_search_by(|spec| spec.name.as_bytes().cmp(&lower[..]))
        .ok()
        .map(|at| &TABLE[at])
}

/// Redis 7.0's error for a command it does not know.
pub(crate) fn unknown_command(args: &[Vec<u8>]) -> Reply {
    let mut listed = String::new();
    for arg in &args[1..] {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        let text = String::from_utf8_lossy(arg);
        let text: String = text.chars().take(room).collect();
        listed.push_str(&format!("'{text}' "));
    }
    let name: String = String::from_utf8_lossy(&args[0])
        .chars()
        .take(128)
        .collect();
    Reply::Error(
        format!("ERR unknown command '{name}', with args beginning with: {listed}")
            .replace(['\r', '\n'], " "),
    )
}

/// Redis's error for an unknown subcommand of a container command.
pub(crate) fn unknown_subcommand(command: &str, sub: &[u8]) -> Reply {
    let sub: String = String::from_utf8_lossy(sub).chars().take(128).collect();
    Reply::Error(format!(
        "ERR unknown subcommand '{sub}'. Try {} HELP.",
        command.to_ascii_uppercase()
    ))
}

/// Runs a data command (arity already checked).
pub(crate) fn run_data(ctx: &mut Ctx, handler: Handler, args: &[Vec<u8>]) -> Reply {
    handler(ctx, args)
}

/// Whether two arguments are equal ignoring ASCII case.
pub(crate) fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// An integer argument, or Redis's error.
pub(crate) fn int_arg(arg: &[u8]) -> Result<i64, Reply> {
    parse_i64(arg).ok_or_else(|| Reply::err(errors::NOT_INTEGER))
}

/// The key's type does not fit the command.
pub(crate) fn wrongtype() -> Reply {
    Reply::err(errors::WRONGTYPE)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_is_sorted() {
        for pair in super::TABLE.windows(2) {
            assert!(
                pair[0].name < pair[1].name,
                "{} {}",
                pair[0].name,
                pair[1].name
            );
        }
    }
}
