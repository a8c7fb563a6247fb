//! Where a benchmark's Redis is: one private `redis-server`, or a private
//! Redis Cluster (every node's figures added up).

use test_support::{RedisCluster, RedisServer};

/// A Redis the workloads run against.
pub(crate) trait Target {
    /// What a lock client is given: `redis://...` for one server,
    /// `redis-cluster://...` for a cluster.
    fn client_url(&self) -> String;
    /// The client port of every `redis-server` process (summed for CPU).
    fn ports(&self) -> Vec<u16>;
    /// The port of the server that holds `key` (for plain connections that
    /// are not the library under test, e.g. W3's counter).
    fn port_of(&self, key: &str) -> u16;
}

/// The URL of the plain server on loopback `port`.
pub(crate) fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

impl Target for RedisServer {
    fn client_url(&self) -> String {
        self.url()
    }

    fn ports(&self) -> Vec<u16> {
        vec![self.port()]
    }

    fn port_of(&self, _key: &str) -> u16 {
        self.port()
    }
}

impl Target for RedisCluster {
    fn client_url(&self) -> String {
        let hosts: Vec<String> = RedisCluster::ports(self)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    fn ports(&self) -> Vec<u16> {
        RedisCluster::ports(self).to_vec()
    }

    fn port_of(&self, key: &str) -> u16 {
        let any = RedisCluster::ports(self)[0];
        let reply = test_support::command(any, &["CLUSTER", "KEYSLOT", key]).expect("KEYSLOT");
        // ":1234\r\n"
        let slot: u16 = reply
            .trim()
            .trim_start_matches(':')
            .parse()
            .expect("a slot number");
        self.primary_of_slot(slot).expect("a primary for the slot")
    }
}
