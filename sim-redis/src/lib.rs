//! A deterministic, synchronous, in-process model of redis-server 7.0, its
//! Sentinel and its Cluster, for simulation tests and tools: the
//! simulation of issue 37 runs the lock client over it, thousands of
//! schedules a run, each replayable from its seed.
//!
//! There is no I/O, no thread, no wall clock and no randomness of its own:
//! every call that depends on time takes the simulated clock (`now_us`,
//! microseconds), each node adds its own skew to it, and every structure
//! iterates in a fixed order. The same calls give the same replies, the
//! same replication stream and the same messages.
//!
//! # Driving it
//!
//! A harness owns the nodes and plays the network:
//!
//! ```
//! use sim_redis::{Node, NodeConfig, Value};
//!
//! let mut node = Node::new(NodeConfig::new("10.0.0.1", 6379));
//! let conn = node.connect();
//! let now_us = 1_700_000_000_000_000;
//! let set = node.execute(conn, &["SET", "lock:{a}", "t1", "NX", "PX", "30000"], now_us);
//! assert_eq!(set.reply, Value::Okay);
//! let ttl = node.execute(conn, &["PTTL", "lock:{a}"], now_us + 1_000_000);
//! assert_eq!(ttl.reply, Value::Int(29_000));
//! ```
//!
//! - [`Node::execute`] runs one command of one connection at one instant,
//!   to its end (a script included: it is atomic and its time is frozen).
//!   Its [`Executed`] has the reply as a [`redis::Value`], shaped as the
//!   `redis` crate parses it off a RESP2 connection (RESP3 after `HELLO
//!   3`), the pub/sub [`Delivery`]s for this node's connections, the
//!   [`Publication`]s a cluster relays to other nodes, and a
//!   [`WaitRequest`] when `WAIT` has to wait: the harness polls
//!   [`Node::wait_satisfied`] as replicas acknowledge, and answers with
//!   [`Node::wait_reply`] then or at the timeout it keeps itself.
//! - Replication is carried by the harness: a primary appends the effects
//!   of each write (`SET ... PXAT <ms>` for a relative expiry, `PEXPIREAT`,
//!   a script's writes wrapped as one unit, `DEL` for a key it expired) to
//!   its stream as [`ReplEntry`]s with Redis's byte offsets;
//!   [`Node::entries_since`] reads them, [`Node::apply`] applies one to a
//!   replica (refusing a [`Gap`]), [`Node::replica_acked`] records a
//!   replica's acknowledgement. [`Node::psync`] and [`Node::apply_sync`]
//!   resynchronise (partially when the histories allow it, else with a
//!   [`Snapshot`]); [`Node::become_replica_of`] and [`Node::promote`]
//!   change roles. Delaying, dropping or cutting the entries, or promoting
//!   a replica that lacks some, is how a failover loses writes.
//! - Time: keys expire on each node's own clock ([`Node::set_clock_skew_us`]),
//!   lazily when a command meets them (a replica hides them until its
//!   primary's `DEL`), or in bulk with [`Node::active_expire`] (Redis's
//!   background expiry, which the harness runs when it likes).
//! - Faults: [`Node::restart_empty`] (no data, no scripts, connections
//!   closed, a new replication history), [`Node::disconnect`]; a stalled
//!   node is one the harness does not call.
//! - Cluster: nodes configured with [`NodeConfig::with_cluster`] share a
//!   [`Topology`] (slots to primaries, replicas) that the harness changes;
//!   they answer `MOVED`, `CROSSSLOT`, `CLUSTERDOWN` and `CLUSTER SLOTS`
//!   from it, and [`Node::topology_changed`] ends the shard-channel
//!   subscriptions of slots a node lost (`sunsubscribe`), as Redis does.
//! - Sentinel: a [`SentinelNode`] answers `SENTINEL MASTER`,
//!   `GET-MASTER-ADDR-BY-NAME`, `PING`, `ROLE` and `SUBSCRIBE` from the
//!   [`MasterState`] the harness sets, and [`SentinelNode::switch_master`]
//!   announces a failover (`+switch-master <name> <old ip> <old port> <new
//!   ip> <new port>`).
//! - Inspection for checkers: [`Node::get`], [`Node::keys`],
//!   [`Node::raw_entries`] (no side effect).
//!
//! A [`Node`] holds its own Lua state and the cluster topology is an
//! `Rc`: nodes live on the harness's one thread (they are not `Send`).
//!
//! # What is modelled
//!
//! Redis 7.0.15's behaviour, replies and error wording for what the lock
//! client and its scripts send: `GET`, `SET` (NX, XX, GET, KEEPTTL, EX, PX,
//! EXAT, PXAT), `DEL`, `UNLINK`, `EXISTS`, `TYPE`, `TTL`, `PTTL`, `EXPIRE`,
//! `PEXPIRE`, `EXPIREAT`, `PEXPIREAT` (NX, XX, GT, LT), `PERSIST`, `RPUSH`,
//! `LPUSH`, `LPOP`, `RPOP`, `LREM`, `LINDEX`, `LRANGE`, `LLEN`, `ZADD` (NX,
//! XX, GT, LT, CH, INCR), `ZREM`, `ZRANGE` (by rank or BYSCORE, REV, LIMIT,
//! WITHSCORES), `ZRANGEBYSCORE`, `ZSCORE`, `ZREMRANGEBYSCORE`, `ZCARD`,
//! `ZCOUNT`, `HSET`, `HDEL`, `HGET`, `HGETALL`, `HLEN`, `PING`, `ECHO`,
//! `TIME`, `SELECT` (16 databases), `SCAN` (MATCH, COUNT, TYPE), `DBSIZE`,
//! `FLUSHALL`, `FLUSHDB`, `INFO` (server, replication, keyspace), `ROLE`,
//! `WAIT`, `HELLO` (2 and 3, AUTH, SETNAME), `AUTH` (the default user's
//! `requirepass`), `CLIENT SETNAME/GETNAME/ID` (`SETINFO` an unknown
//! subcommand, as in 7.0), `READONLY`, `READWRITE`, `ASKING`, `QUIT`,
//! `RESET`, `PUBLISH`, `SPUBLISH`, `SUBSCRIBE`, `SSUBSCRIBE` and their
//! `UNSUBSCRIBE`s (RESP2's subscribed mode included), `EVAL`, `EVALSHA`,
//! `EVAL_RO`, `EVALSHA_RO`, `SCRIPT LOAD/EXISTS/FLUSH/KILL`, `CLUSTER
//! SLOTS/MYID/KEYSLOT/INFO`; with [`Flavour`], Valkey 9's `DELIFEQ` and
//! Redis 8.4's `DELEX key IFEQ|IFNE value` (and `CLIENT SETINFO`).
//! Unknown commands, wrong arity, `WRONGTYPE`, `NOAUTH`, `READONLY`,
//! `MOVED`, `CROSSSLOT` as Redis words them.
//!
//! Scripts run in Lua 5.1 (mlua's vendored build) set up as Redis 7.0
//! sets up its own: `KEYS`, `ARGV`, `redis.call`/`pcall` (a C function, so
//! that an error names the script's line even after `return redis.call`),
//! `redis.error_reply`, `status_reply`, `sha1hex`, `log` (a no-op),
//! `setresp(2)`, `set_repl`, `replicate_commands`, Redis's `pcall`, its
//! `math.random` (`rand48`, seeded once per node); globals and library
//! tables read-only, a missing global an error; the conversions both ways
//! (numbers truncated, `false` as nil, arrays up to the first nil,
//! `{err=}`/`{ok=}`/`{double=}` tables, Lua numbers as arguments written
//! with `%.17g`); errors as `... script: <sha>, on @user_script:<line>.`;
//! shebang flags (`no-writes`, `allow-cross-slot-keys`, `no-cluster`...);
//! the script cache by SHA1 per node (compiled once), `NOSCRIPT`, and the
//! checks Redis makes on each command of a script (unknown, arity, not
//! allowed from scripts, writes on a replica or in a read-only script, a
//! non-local key or another slot in a cluster).
//!
//! # What is not
//!
//! Persistence; ACL users and rules (only the default user's password);
//! `MULTI`/`EXEC` from clients; keyspace notifications; `PSUBSCRIBE`;
//! blocking commands; client-side caching; slot migration (`ASK`,
//! `TRYAGAIN`); eviction and `maxmemory`; replicas of replicas; the
//! `REPLCONF GETACK` and `PING`s a primary adds to its stream (offsets
//! count only the entries, their `SELECT`s and `MULTI`/`EXEC`); the Lua
//! libraries `cjson`, `cmsgpack`, `bit` and `struct`, RESP3 inside scripts
//! (`redis.setresp(3)`), `setmetatable` and `getfenv` on the read-only
//! tables (Redis's patched Lua refuses more of them). Commands the lock
//! client never sends are unknown commands here.
//!
//! # Known differences from a real server
//!
//! Listed in the README, with how the fidelity test compares them: `TIME`
//! and everything taken from the clock (a real server's clock moves during
//! a step); `SCAN`'s order and cursors (compared as the set of keys a whole
//! iteration returns); `DBSIZE` counts only live keys (Redis counts expired
//! keys until its background expiry removes them); a large hash's field
//! order (Redis orders a hash of more than 128 fields as a hash table).
//!
//! Against Valkey 8/9 and Redis 7.2+, which the project may meet: scores
//! and Lua numbers are written in the shortest form that reads back the
//! same (`0.1`, not `0.10000000000000001`); `CLIENT SETINFO` is known;
//! Valkey 9 has `DELIFEQ`, Redis 8.4 `DELEX`.

mod cluster;
mod commands;
mod config;
mod ctx;
mod glob;
mod keyspace;
mod lua;
mod node;
mod number;
mod pubsub;
mod replication;
mod reply;
mod sentinel;

pub use cluster::{key_slot, ClusterNode, SharedTopology, Topology, SLOTS};
pub use config::{ClusterConfig, Flavour, NodeConfig};
pub use keyspace::{Data, Entry, Hash, ZSet};
pub use node::{Executed, Node, WaitRequest, REDIS_VERSION};
pub use pubsub::{ConnId, Delivery, Message, MessageKind, Publication};
pub use redis::Value;
pub use replication::{Gap, LinkState, ReplEntry, Role, Snapshot, Sync};
pub use sentinel::{parse_switch_master, MasterState, SentinelNode, SWITCH_MASTER};
