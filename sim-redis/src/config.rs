//! How a node is set up.

use crate::cluster::SharedTopology;

/// Which server a node plays: Redis 7.0 itself, or a newer server whose
/// conditional delete the project can use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flavour {
    /// redis-server 7.0 (what this machine runs): no conditional delete;
    /// `CLIENT SETINFO` is an unknown subcommand.
    #[default]
    Redis7,
    /// Redis 8.4: `DELEX key [IFEQ value | IFNE value]`; `CLIENT SETINFO`
    /// accepted.
    Redis84,
    /// Valkey 9: `DELIFEQ key value`; `CLIENT SETINFO` accepted.
    Valkey9,
}

/// A node's place in a Redis Cluster: its id in the shared topology.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub topology: SharedTopology,
    /// The node's 40-character id, as the topology names it.
    pub node_id: String,
}

/// How a [`Node`](crate::Node) is set up.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The address the node announces (`ROLE` of its replicas, `MOVED`,
    /// `CLUSTER SLOTS`); the harness routes by it.
    pub host: String,
    pub port: u16,
    pub flavour: Flavour,
    /// `requirepass`: the password of the `default` user, if any.
    pub password: Option<String>,
    /// Cluster mode, if set.
    pub cluster: Option<ClusterConfig>,
    /// How many entries of its replication stream a primary keeps for
    /// partial resynchronisation (Redis keeps 1 MB of bytes by default).
    pub backlog_entries: usize,
}

impl NodeConfig {
    /// A standalone Redis 7.0 at `host:port`, no password.
    pub fn new(host: impl Into<String>, port: u16) -> NodeConfig {
        NodeConfig {
            host: host.into(),
            port,
            flavour: Flavour::Redis7,
            password: None,
            cluster: None,
            backlog_entries: 100_000,
        }
    }

    pub fn with_flavour(mut self, flavour: Flavour) -> NodeConfig {
        self.flavour = flavour;
        self
    }

    pub fn with_password(mut self, password: impl Into<String>) -> NodeConfig {
        self.password = Some(password.into());
        self
    }

    pub fn with_cluster(
        mut self,
        topology: SharedTopology,
        node_id: impl Into<String>,
    ) -> NodeConfig {
        self.cluster = Some(ClusterConfig {
            topology,
            node_id: node_id.into(),
        });
        self
    }
}
