//! A private Redis Sentinel setup: a primary, replicas of it
//! (`--replicaof`) and sentinels (`redis-server <config> --sentinel`, each
//! with a configuration file written to a temporary directory: Sentinel
//! rewrites it as it learns), every process on free loopback ports. The
//! sentinels watch the primary under the name [`MASTER_NAME`] with a quorum
//! of 2, declare it down after [`DOWN_AFTER_MS`] without an answer, and
//! fail over to a replica. Everything is stopped (sentinels first, so that
//! they fail nothing over meanwhile) and the directory removed on drop.
//!
//! The replicas log in to their primary as the user [`REPLICATION_USER`],
//! which only they use: [`RedisSentinel::cut_replication`] turns it off on
//! the primary and closes their links, so that writes from then on reach
//! the primary alone (the replica promoted after it dies lacks them), while
//! the sentinels and the clients (user `default`) go on as before.
//!
//! [`SentinelOptions`] adds a password to the sentinels (`requirepass`,
//! which they also use with each other) and users of the caller's to every
//! data node (ACL rules are not replicated: each node gets them at start).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{free_port, Login, RedisServer, TlsOptions};

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "mymaster";

/// How long a primary may be silent before a sentinel thinks it down
/// (`down-after-milliseconds`): small, so that a failover takes seconds.
pub const DOWN_AFTER_MS: u64 = 1000;

/// `failover-timeout`: also how long a sentinel waits before it tries a
/// failover of the same primary again (twice this), after one that failed.
pub const FAILOVER_TIMEOUT_MS: u64 = 4000;

/// The user the replicas log in to their primary as.
pub const REPLICATION_USER: &str = "repl";
const REPLICATION_PASSWORD: &str = "repl-secret";

/// How long the setup may take to form, or to settle after a failover.
const SETTLE: Duration = Duration::from_secs(30);

/// How to start a [`RedisSentinel`] beyond the defaults.
#[derive(Clone, Default)]
pub struct SentinelOptions {
    /// The sentinels' password (`None`: none): `requirepass`, or with
    /// [`sentinel_user`](Self::sentinel_user) that user's.
    pub sentinel_password: Option<String>,
    /// A user of the sentinels' own (their ACL: `default` turned off, this
    /// user allowed everything), which they also use with each other
    /// (`sentinel sentinel-user`); needs a password.
    pub sentinel_user: Option<String>,
    /// Users made on every data node at start: each an ACL rule as
    /// `ACL SETUSER` takes it, the user's name first (`["locker", "on",
    /// ">secret", "~lock:*", ...]`).
    pub node_users: Vec<Vec<String>>,
    /// TLS only, everywhere: the data nodes and the sentinels serve TLS
    /// (this crate's certificates), replicate and reach each other over it
    /// (`tls-replication yes`).
    pub tls: Option<TlsOptions>,
    /// `down-after-milliseconds` (`None`: [`DOWN_AFTER_MS`]).
    pub down_after_ms: Option<u64>,
}

/// A running private Sentinel setup.
pub struct RedisSentinel {
    /// The data nodes (the first started as the primary); `None` once
    /// killed.
    nodes: Vec<Option<RedisServer>>,
    node_ports: Vec<u16>,
    /// The sentinels; `None` once killed.
    sentinels: Vec<Option<RedisServer>>,
    sentinel_ports: Vec<u16>,
    options: SentinelOptions,
    dir: PathBuf,
}

impl RedisSentinel {
    /// A primary, two replicas and three sentinels, every replica in sync
    /// and every sentinel knowing the replicas and the other sentinels.
    /// Panics with instructions when it cannot start.
    pub fn start() -> RedisSentinel {
        Self::try_start(2, 3).unwrap_or_else(|error| panic!("{error}"))
    }

    /// `replicas` replicas and `sentinels` sentinels (a quorum of 2, so at
    /// least 2), returning an error instead of panicking.
    pub fn try_start(replicas: usize, sentinels: usize) -> io::Result<RedisSentinel> {
        Self::try_start_with(replicas, sentinels, SentinelOptions::default())
    }

    /// A primary, two replicas and three sentinels set up by `options`.
    /// Panics with instructions when it cannot start.
    pub fn start_with(options: SentinelOptions) -> RedisSentinel {
        Self::try_start_with(2, 3, options).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`try_start`](Self::try_start) set up by `options`.
    pub fn try_start_with(
        replicas: usize,
        sentinels: usize,
        options: SentinelOptions,
    ) -> io::Result<RedisSentinel> {
        let dir = std::env::temp_dir().join(format!(
            "lock-test-sentinel-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir)?;
        let mut setup = RedisSentinel {
            nodes: Vec::new(),
            node_ports: Vec::new(),
            sentinels: Vec::new(),
            sentinel_ports: Vec::new(),
            options,
            dir,
        };
        let primary = setup.start_node(None)?;
        let primary_port = primary.port();
        setup.node_ports.push(primary_port);
        setup.nodes.push(Some(primary));
        for _ in 0..replicas {
            let replica = setup.start_node(Some(primary_port))?;
            setup.node_ports.push(replica.port());
            setup.nodes.push(Some(replica));
        }
        setup.wait_until_replicated()?;
        for index in 0..sentinels {
            let sentinel = setup.start_sentinel(index, primary_port)?;
            setup.sentinel_ports.push(sentinel.port());
            setup.sentinels.push(Some(sentinel));
        }
        setup.wait_until_known(replicas, sentinels)?;
        Ok(setup)
    }

    /// A data node: the primary (`replica_of` `None`) or a replica of the
    /// node on that port. Every node has the replication user and logs in
    /// with it (a primary may become a replica after a failover).
    fn start_node(&self, replica_of: Option<u16>) -> io::Result<RedisServer> {
        let mut extra: Vec<String> = [
            "--user",
            REPLICATION_USER,
            "on",
            &format!(">{REPLICATION_PASSWORD}"),
            "~*",
            "&*",
            "+@all",
            "--masteruser",
            REPLICATION_USER,
            "--masterauth",
            REPLICATION_PASSWORD,
            // The primary's data from the socket, no RDB file on disk.
            "--repl-diskless-load",
            "on-empty-db",
        ]
        .map(str::to_owned)
        .to_vec();
        for user in &self.options.node_users {
            extra.push("--user".to_owned());
            extra.extend(user.iter().cloned());
        }
        if let Some(primary) = replica_of {
            extra.extend(["--replicaof".to_owned(), "127.0.0.1".to_owned()]);
            extra.push(primary.to_string());
        }
        if self.options.tls.is_some() {
            extra.extend(["--tls-replication", "yes"].map(str::to_owned));
        }
        let mut last_error = None;
        for _ in 0..5 {
            let started = match &self.options.tls {
                Some(tls) => RedisServer::start_tls_with(free_port()?, tls, &extra),
                None => RedisServer::launch(free_port()?, None, &extra),
            };
            match started {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("a data node did not start")))
    }

    /// Sentinel number `index`, watching the primary on `primary`.
    fn start_sentinel(&self, index: usize, primary: u16) -> io::Result<RedisServer> {
        let mut last_error = None;
        for _ in 0..5 {
            let port = free_port()?;
            let config = self.dir.join(format!("sentinel-{index}.conf"));
            let login = self
                .options
                .sentinel_password
                .clone()
                .map(|password| Login {
                    user: self.options.sentinel_user.clone(),
                    password,
                });
            let down_after = self.options.down_after_ms.unwrap_or(DOWN_AFTER_MS);
            write_sentinel_config(
                &config,
                port,
                &self.dir,
                primary,
                down_after,
                login.as_ref(),
            )?;
            let tls = self
                .options
                .tls
                .as_ref()
                .map(|tls| (tls, self.dir.join(format!("sentinel-{index}-tls"))));
            match RedisServer::launch_sentinel(port, &config, login, tls) {
                Ok(server) => return Ok(server),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("a sentinel did not start")))
    }

    /// The name the sentinels know the primary by ([`MASTER_NAME`]).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The sentinels' ports (killed ones included), in start order.
    pub fn sentinel_ports(&self) -> &[u16] {
        &self.sentinel_ports
    }

    /// The data nodes' ports (killed ones included); the first was the
    /// primary at start.
    pub fn node_ports(&self) -> &[u16] {
        &self.node_ports
    }

    /// `redis-sentinel://127.0.0.1:P1,127.0.0.1:P2,.../mymaster`
    /// (`rediss-sentinel://` with TLS), with `credentials`
    /// (`user:password@`, or empty) for the data nodes, and
    /// `?sentinel_password=...` (and `sentinel_user=...`) when the
    /// sentinels have one.
    pub fn url(&self, credentials: &str) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let query = match (&self.options.sentinel_user, &self.options.sentinel_password) {
            (Some(user), Some(password)) => {
                format!("?sentinel_user={user}&sentinel_password={password}")
            }
            (None, Some(password)) => format!("?sentinel_password={password}"),
            _ => String::new(),
        };
        let scheme = match self.options.tls {
            Some(_) => "rediss-sentinel",
            None => "redis-sentinel",
        };
        format!(
            "{scheme}://{credentials}{}/{MASTER_NAME}{query}",
            hosts.join(",")
        )
    }

    /// The data node on `port`, if it runs.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().flatten().find(|node| node.port() == port)
    }

    /// Sentinel number `index`, if it runs.
    pub fn sentinel(&self, index: usize) -> Option<&RedisServer> {
        self.sentinels.get(index).and_then(Option::as_ref)
    }

    /// The port of the data node that says it is the primary (`ROLE`), if
    /// exactly one live node does.
    pub fn primary(&self) -> Option<u16> {
        let primaries: Vec<u16> = self
            .nodes
            .iter()
            .flatten()
            .filter(|node| {
                node.command(&["ROLE"])
                    .is_ok_and(|role| role.contains("master"))
            })
            .map(RedisServer::port)
            .collect();
        (primaries.len() == 1).then(|| primaries[0])
    }

    /// The primary's port as each live sentinel names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn named_primaries(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .flatten()
            .map(|sentinel| {
                let reply = sentinel
                    .command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                    .ok()?;
                reply.lines().nth(4)?.trim().parse().ok()
            })
            .collect()
    }

    /// The ports of the live data nodes that replicate the primary on
    /// `primary`, in sync with it.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        self.nodes
            .iter()
            .flatten()
            .filter(|node| {
                node.command(&["INFO", "replication"]).is_ok_and(|info| {
                    info.contains(&format!("master_port:{primary}\r\n"))
                        && info.contains("master_link_status:up")
                })
            })
            .map(RedisServer::port)
            .collect()
    }

    /// Waits (bounded) until every live sentinel names a primary other
    /// than the one on `old`, the node there says it is the primary, and
    /// (when `replicas` > 0) that many live nodes replicate it in sync.
    /// Returns its port.
    pub fn wait_for_new_primary(&self, old: u16, replicas: usize) -> io::Result<u16> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let named = self.named_primaries();
            if let Some(Some(port)) = named.first() {
                let agreed = *port != old && named.iter().all(|named| *named == Some(*port));
                let is_primary = agreed
                    && self.node(*port).is_some_and(|node| {
                        node.command(&["ROLE"])
                            .is_ok_and(|role| role.contains("master"))
                    });
                if is_primary && self.replicas_of(*port).len() >= replicas {
                    return Ok(*port);
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the sentinels did not fail over from port {old} within {SETTLE:?} \
                         (they name {named:?})"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks a live sentinel for a failover now (`SENTINEL FAILOVER`): it
    /// promotes a replica without waiting for the primary to be down (and
    /// without stopping its writes first).
    pub fn failover(&self) -> io::Result<()> {
        let sentinel = self
            .sentinels
            .iter()
            .flatten()
            .next()
            .ok_or_else(|| io::Error::other("no sentinel runs"))?;
        let reply = sentinel.command(&["SENTINEL", "FAILOVER", MASTER_NAME])?;
        if reply.starts_with("+OK") {
            Ok(())
        } else {
            Err(io::Error::other(format!("SENTINEL FAILOVER: {reply:?}")))
        }
    }

    /// Kills the data node on `port` (SIGKILL).
    pub fn kill_node(&mut self, port: u16) {
        for slot in &mut self.nodes {
            if slot.as_ref().is_some_and(|node| node.port() == port) {
                if let Some(mut node) = slot.take() {
                    node.kill();
                }
            }
        }
    }

    /// Kills sentinel number `index` (SIGKILL).
    pub fn kill_sentinel(&mut self, index: usize) {
        if let Some(mut sentinel) = self.sentinels.get_mut(index).and_then(Option::take) {
            sentinel.kill();
        }
    }

    /// Cuts replication from the primary on `primary`: the replication user
    /// is turned off there and the replicas' links closed, so they cannot
    /// log in again. Writes from then on reach that primary alone; the
    /// sentinels and the clients are not affected.
    pub fn cut_replication(&self, primary: u16) -> io::Result<()> {
        let node = self
            .node(primary)
            .ok_or_else(|| io::Error::other(format!("no live node on port {primary}")))?;
        let off = node.command(&["ACL", "SETUSER", REPLICATION_USER, "off"])?;
        if !off.starts_with("+OK") {
            return Err(io::Error::other(format!("ACL SETUSER: {off:?}")));
        }
        node.command(&["CLIENT", "KILL", "USER", REPLICATION_USER])?;
        Ok(())
    }

    /// Waits (bounded) until every live replica of the live primary has
    /// everything it wrote.
    pub fn wait_until_replicated(&self) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(primary) = self.primary().and_then(|port| self.node(port)) {
                let offset = |server: &RedisServer, field: &str| -> Option<String> {
                    server
                        .command(&["INFO", "replication"])
                        .ok()?
                        .lines()
                        .find_map(|line| line.strip_prefix(field))
                        .map(str::to_owned)
                };
                let written = offset(primary, "master_repl_offset:");
                let replicas: Vec<&RedisServer> = self
                    .nodes
                    .iter()
                    .flatten()
                    .filter(|node| node.port() != primary.port())
                    .collect();
                let synced = replicas.iter().all(|replica| {
                    replica.command(&["INFO", "replication"]).is_ok_and(|info| {
                        info.contains(&format!("master_port:{}\r\n", primary.port()))
                            && info.contains("master_link_status:up")
                    }) && offset(replica, "slave_repl_offset:") == written
                });
                if synced {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the replicas were not in sync within {SETTLE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until every sentinel knows `replicas` replicas and
    /// the `sentinels - 1` other sentinels (they find each other through
    /// the primary every 2 s): then a failover can be agreed on.
    fn wait_until_known(&self, replicas: usize, sentinels: usize) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let known = self.sentinels.iter().flatten().all(|sentinel| {
                let Ok(reply) = sentinel.command(&["SENTINEL", "MASTER", MASTER_NAME]) else {
                    return false;
                };
                field(&reply, "num-slaves") == Some(replicas.to_string())
                    && field(&reply, "num-other-sentinels") == Some((sentinels - 1).to_string())
            });
            if known {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the sentinels did not learn of {replicas} replicas and each other \
                         within {SETTLE:?}"
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // The sentinels first: they fail nothing over while the nodes stop.
        self.sentinels.clear();
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A sentinel's configuration: its port, its directory, the primary to
/// watch and how quickly to fail it over (down after `down_after` ms).
fn write_sentinel_config(
    path: &Path,
    port: u16,
    dir: &Path,
    primary: u16,
    down_after: u64,
    login: Option<&Login>,
) -> io::Result<()> {
    let mut config = format!(
        "port {port}\n\
         bind 127.0.0.1\n\
         daemonize no\n\
         loglevel warning\n\
         dir \"{dir}\"\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} {down_after}\n\
         sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {MASTER_NAME} 2\n",
        dir = dir.display()
    );
    match login {
        Some(Login {
            user: Some(user),
            password,
        }) => config.push_str(&format!(
            "user default off\n\
             user {user} on >{password} ~* &* +@all\n\
             sentinel sentinel-user {user}\n\
             sentinel sentinel-pass {password}\n"
        )),
        Some(Login {
            user: None,
            password,
        }) => config.push_str(&format!("requirepass \"{password}\"\n")),
        None => {}
    }
    std::fs::write(path, config)
}

/// The value of `name` in a RESP reply of field/value pairs
/// (`SENTINEL MASTER`).
fn field(reply: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = reply.split("\r\n").collect();
    let at = lines.iter().position(|line| *line == name)?;
    // `$len`, then the value.
    lines.get(at + 2).map(|value| (*value).to_owned())
}
