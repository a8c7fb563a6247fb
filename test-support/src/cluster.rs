//! A private Redis Cluster: primaries and replicas, each a `redis-server`
//! with `cluster-enabled yes` on free loopback ports (client and bus), its
//! files in a temporary directory of its own; created with
//! `redis-cli --cluster create`, waited for until every node reports
//! `cluster_state:ok`, stopped (and its files removed) on drop. A TLS
//! cluster ([`RedisCluster::start_tls`]) serves TLS only, between its
//! nodes too (`tls-cluster`, `tls-replication`).

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, RedisServer, TlsOptions};

/// The environment variable naming the `redis-cli` binary (default: found on
/// `PATH`).
pub const REDIS_CLI_ENV: &str = "REDIS_CLI";

/// How long a cluster may take to form (or to settle after a change).
const SETTLE: Duration = Duration::from_secs(30);

/// A running private cluster.
pub struct RedisCluster {
    /// Every node, by start order; `None` once killed.
    nodes: Vec<Option<RedisServer>>,
    /// The client port of each node (also of killed ones).
    ports: Vec<u16>,
    dir: PathBuf,
    /// A TLS cluster's settings (every node has the same).
    tls: Option<TlsOptions>,
}

impl RedisCluster {
    /// Starts `primaries` primaries with `replicas` replicas each, and waits
    /// until the cluster is formed. Panics with instructions when it cannot.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        Self::try_start(primaries, replicas).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Like [`start`](Self::start), returning an error.
    pub fn try_start(primaries: usize, replicas: usize) -> io::Result<RedisCluster> {
        Self::try_start_with(primaries, replicas, None)
    }

    /// Like [`start`](Self::start), every node serving TLS only (set up
    /// by `tls`), to its clients and to the other nodes.
    pub fn start_tls(primaries: usize, replicas: usize, tls: &TlsOptions) -> RedisCluster {
        Self::try_start_with(primaries, replicas, Some(tls))
            .unwrap_or_else(|error| panic!("{error}"))
    }

    fn try_start_with(
        primaries: usize,
        replicas: usize,
        tls: Option<&TlsOptions>,
    ) -> io::Result<RedisCluster> {
        let dir = std::env::temp_dir().join(format!(
            "lock-test-cluster-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir)?;
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            ports: Vec::new(),
            dir,
            tls: tls.cloned(),
        };
        for index in 0..primaries * (1 + replicas) {
            let node = cluster.start_node(index)?;
            cluster.ports.push(node.port());
            cluster.nodes.push(Some(node));
        }
        let mut create = Command::new(cli());
        create.args(cluster.cli_tls_args());
        create.args(["--cluster", "create"]);
        for port in &cluster.ports {
            create.arg(format!("127.0.0.1:{port}"));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let output = create.output().map_err(|error| {
            io::Error::new(
                error.kind(),
                format!(
                    "cannot run `redis-cli` ({error}): install it (`apt-get install redis-tools`) \
                     or set {REDIS_CLI_ENV} to its path"
                ),
            )
        })?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        cluster.wait_until_ok()?;
        cluster.wait_for_replicas(primaries * replicas)?;
        Ok(cluster)
    }

    /// Waits (bounded) until `count` nodes are replicas (`redis-cli` makes
    /// them so after the cluster is ok) and every one is in sync with its
    /// primary.
    fn wait_for_replicas(&self, count: usize) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let info = self.nodes_info();
            let replicas: Vec<u16> = info
                .lines()
                .filter(|line| line.contains("slave"))
                .filter_map(node_port)
                .collect();
            let synced = replicas.len() == count
                && replicas.iter().all(|&port| {
                    self.command(port, &["INFO", "replication"])
                        .is_ok_and(|info| info.contains("master_link_status:up"))
                });
            if synced {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the test cluster's {count} replicas were not in sync within {SETTLE:?}"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn start_node(&self, index: usize) -> io::Result<RedisServer> {
        let node_dir = self.dir.join(format!("node-{index}"));
        std::fs::create_dir_all(&node_dir)?;
        let mut last_error = None;
        for _ in 0..5 {
            let (port, bus) = (free_port()?, free_port()?);
            if port == bus {
                continue;
            }
            let extra = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--dir",
                &node_dir.display().to_string(),
            ]
            .map(str::to_owned);
            let started = match &self.tls {
                Some(tls) => {
                    let mut extra = extra.to_vec();
                    extra.extend(
                        ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                    );
                    RedisServer::start_tls_with(port, tls, &extra)
                }
                // Fresh ports: another pair at once rather than patience.
                None => RedisServer::launch(port, None, &extra),
            };
            match started {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("a cluster node did not start")))
    }

    /// The client ports of every node (killed ones included).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The nodes' URLs (the seed list a client is given).
    pub fn urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.ports
            .iter()
            .map(|port| format!("{scheme}://127.0.0.1:{port}/"))
            .collect()
    }

    /// Sends one command to the node on `port` (over TLS for a TLS
    /// cluster) and returns the raw reply.
    pub fn command(&self, port: u16, args: &[&str]) -> io::Result<String> {
        match self.node(port) {
            Some(node) => node.command(args),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no live node of the cluster on port {port}"),
            )),
        }
    }

    /// `redis-cli`'s TLS arguments for this cluster (none without TLS).
    fn cli_tls_args(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flatten()
            .find_map(RedisServer::tls_dir)
            .map(TlsOptions::cli_args)
            .unwrap_or_default()
    }

    /// The ports of the nodes that are primaries now (as one live node
    /// sees it).
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes_info()
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .filter_map(node_port)
            .collect()
    }

    /// The port of the primary that serves `slot` now.
    pub fn primary_of_slot(&self, slot: u16) -> Option<u16> {
        self.nodes_info()
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .find(|line| {
                line.split(' ').skip(8).any(|range| {
                    let mut bounds = range.split('-');
                    let (Some(low), high) = (bounds.next(), bounds.next()) else {
                        return false;
                    };
                    let (Ok(low), Ok(high)) =
                        (low.parse::<u16>(), high.unwrap_or(low).parse::<u16>())
                    else {
                        return false;
                    };
                    (low..=high).contains(&slot)
                })
            })
            .and_then(node_port)
    }

    /// The port of a replica of the primary on `primary` port.
    pub fn replica_of(&self, primary: u16) -> Option<u16> {
        let info = self.nodes_info();
        let id = info
            .lines()
            .find(|line| node_port(line) == Some(primary))?
            .split(' ')
            .next()?
            .to_owned();
        info.lines()
            .filter(|line| line.contains("slave") && !line.contains("fail"))
            .find(|line| line.split(' ').nth(3) == Some(&id))
            .and_then(node_port)
    }

    /// `CLUSTER NODES` as one live node answers it.
    pub fn nodes_info(&self) -> String {
        self.live_ports()
            .into_iter()
            .find_map(|port| self.command(port, &["CLUSTER", "NODES"]).ok())
            .map(|reply| bulk(&reply))
            .unwrap_or_default()
    }

    fn live_ports(&self) -> Vec<u16> {
        self.nodes.iter().flatten().map(RedisServer::port).collect()
    }

    /// The node on `port`, if it runs.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().flatten().find(|node| node.port() == port)
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        for slot in &mut self.nodes {
            if slot.as_ref().is_some_and(|node| node.port() == port) {
                if let Some(mut node) = slot.take() {
                    node.kill();
                }
            }
        }
    }

    /// Waits (bounded) until every live node reports `cluster_state:ok`
    /// and agrees that all 16384 slots are served.
    pub fn wait_until_ok(&self) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let ok = self.live_ports().into_iter().all(|port| {
                self.command(port, &["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                })
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the test cluster was not ok within {SETTLE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `redis-cli` with `args` (for `--cluster reshard` and the like;
    /// with the TLS arguments first for a TLS cluster); returns its
    /// standard output, or an error with its standard error.
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        let output = Command::new(cli())
            .args(self.cli_tls_args())
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "redis-cli {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear(); // each node stops on drop
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The client port of a `CLUSTER NODES` line (`id ip:port@bus ...`).
fn node_port(line: &str) -> Option<u16> {
    let address = line.split(' ').nth(1)?;
    let port = address.split('@').next()?.rsplit(':').next()?;
    port.parse().ok()
}

/// The text of a RESP bulk (or verbatim) string reply.
fn bulk(reply: &str) -> String {
    let body = reply.split_once("\r\n").map_or("", |(_, rest)| rest);
    let body = body.strip_suffix("\r\n").unwrap_or(body);
    body.strip_prefix("txt:").unwrap_or(body).to_owned()
}

fn cli() -> PathBuf {
    std::env::var_os(REDIS_CLI_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-cli"))
}
