//! Redis Cluster: hash slots (CRC16 of the key or of its hash tag, mod
//! 16384) and the topology the harness keeps for every node: which node
//! serves which slot, and the replicas of each primary. Nodes read it on
//! every keyed command (redirecting with `MOVED`) and for `CLUSTER SLOTS`.

use std::cell::RefCell;
use std::rc::Rc;

use crate::reply::Reply;

/// The number of hash slots.
pub const SLOTS: u16 = 16384;

/// The hash slot of a key (or shard channel): CRC16 (XMODEM) of its hash
/// tag, the part between the first `{` and the next `}` when it is not
/// empty, else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS
}

/// A node of the cluster as the topology knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40 characters, as Redis names nodes.
    pub id: String,
    pub host: String,
    pub port: u16,
    /// The id of its primary, for a replica.
    pub replica_of: Option<String>,
}

/// Who serves what: the cluster's configuration, as its nodes agree on it
/// (the harness changes it: a failover, a slot moved).
#[derive(Clone, Debug)]
pub struct Topology {
    nodes: Vec<ClusterNode>,
    /// The primary serving each slot (an index into `nodes`).
    slots: Vec<Option<usize>>,
}

impl Default for Topology {
    fn default() -> Topology {
        Topology {
            nodes: Vec::new(),
            slots: vec![None; SLOTS as usize],
        }
    }
}

/// The topology, shared by the harness and every node of the cluster.
pub type SharedTopology = Rc<RefCell<Topology>>;

impl Topology {
    pub fn new() -> Topology {
        Topology::default()
    }

    /// A handle to share with the nodes.
    pub fn shared(self) -> SharedTopology {
        Rc::new(RefCell::new(self))
    }

    /// Adds a node (or replaces the one with its id).
    pub fn add_node(&mut self, node: ClusterNode) {
        match self.nodes.iter().position(|known| known.id == node.id) {
            Some(at) => self.nodes[at] = node,
            None => self.nodes.push(node),
        }
    }

    pub fn node(&self, id: &str) -> Option<&ClusterNode> {
        self.nodes.iter().find(|node| node.id == id)
    }

    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Makes node `id` serve slots `first..=last` (a primary).
    ///
    /// Panics if the node is unknown: a harness mistake.
    pub fn assign(&mut self, first: u16, last: u16, id: &str) {
        let at = self.index(id);
        for slot in first..=last {
            self.slots[slot as usize] = Some(at);
        }
    }

    /// Leaves slots `first..=last` unserved.
    pub fn unassign(&mut self, first: u16, last: u16) {
        for slot in first..=last {
            self.slots[slot as usize] = None;
        }
    }

    /// Makes `replica` a replica of `primary` (`None`: a primary).
    pub fn set_replica_of(&mut self, replica: &str, primary: Option<&str>) {
        let at = self.index(replica);
        self.nodes[at].replica_of = primary.map(str::to_owned);
    }

    /// A failover: `replica` takes every slot of its primary and becomes a
    /// primary; the old primary becomes its replica.
    pub fn fail_over(&mut self, replica: &str) {
        let new = self.index(replica);
        let Some(old_id) = self.nodes[new].replica_of.clone() else {
            return;
        };
        let old = self.index(&old_id);
        for slot in self.slots.iter_mut() {
            if *slot == Some(old) {
                *slot = Some(new);
            }
        }
        for node in self.nodes.iter_mut() {
            if node.replica_of.as_deref() == Some(old_id.as_str()) {
                node.replica_of = Some(replica.to_owned());
            }
        }
        self.nodes[new].replica_of = None;
        self.nodes[old].replica_of = Some(replica.to_owned());
    }

    /// The primary serving `slot`.
    pub fn owner(&self, slot: u16) -> Option<&ClusterNode> {
        self.slots[slot as usize].map(|at| &self.nodes[at])
    }

    fn index(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .unwrap_or_else(|| panic!("no node {id} in the cluster topology"))
    }

    /// `CLUSTER SLOTS`: each run of slots of one primary, with the
    /// primary then its replicas (`[ip, port, id, {}]` each).
    pub(crate) fn slots_reply(&self) -> Reply {
        let node_reply = |node: &ClusterNode| {
            Reply::Array(vec![
                Reply::bulk(node.host.as_bytes()),
                Reply::Int(i64::from(node.port)),
                Reply::bulk(node.id.as_bytes()),
                Reply::Map(Vec::new()),
            ])
        };
        let mut ranges = Vec::new();
        let mut slot = 0usize;
        while slot < SLOTS as usize {
            let Some(owner) = self.slots[slot] else {
                slot += 1;
                continue;
            };
            let start = slot;
            while slot < SLOTS as usize && self.slots[slot] == Some(owner) {
                slot += 1;
            }
            let primary = &self.nodes[owner];
            let mut range = vec![
                Reply::Int(start as i64),
                Reply::Int(slot as i64 - 1),
                node_reply(primary),
            ];
            for node in &self.nodes {
                if node.replica_of.as_deref() == Some(primary.id.as_str()) {
                    range.push(node_reply(node));
                }
            }
            ranges.push(Reply::Array(range));
        }
        Reply::Array(ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_are_those_of_redis() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }
}
