//! A deterministic, synchronous, in-process model of redis-server 7.0,
//! for simulation tests and tools (see the crate's README.md).
//!
//! TODO: full docs.

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
