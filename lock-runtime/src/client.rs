//! The Redis client: configuration, the process-wide default client and the
//! one place that applies deadlines to Redis calls.

use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

mod from_redis;
mod sentinel;

use crate::backend::{Ack, Backend, QuorumBackend, RedisBackend, Sentinels, Target as CallTarget};
use crate::backend::{Listen, Notifier};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::lease::holders::Identity;
use crate::lease::renewal::RenewalStats;
use crate::lease::Core;
use crate::redact::redact_url;
use crate::tls::{self, TlsSettings};
use crate::token::Random;
use crate::transport::switches::Switches;
use crate::transport::Transport;
use crate::wall_clock::WallClock;

/// The environment variable read when [`init`] was not called.
pub const REDIS_URL_ENV: &str = "REDIS_URL";

/// How to reach Redis and how long to wait for it.
///
/// `Debug` masks the password of the URL and never shows the TLS client
/// key.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::Config;
///
/// fn main() -> Result<(), lock_runtime::LockError> {
///     let config = Config::new("redis://:secret@redis.internal:6379/0")
///         .connect_timeout(Duration::from_secs(2))
///         .response_timeout(Duration::from_millis(500))
///         .key_prefix("billing:lock:") // every key the locks use starts with it
///         .instance("billing-7f9c"); // lockctl's INSTANCE column
///     println!("{config:?}"); // the password shows as `***`
///
///     // A Redis Cluster by its seed nodes, or a quorum of independent masters:
///     let _cluster = Config::cluster(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]);
///     let _quorum = Config::quorum(["redis://a:6379/", "redis://b:6379/", "redis://c:6379/"]);
///
///     // The process-wide client (the attribute's, `Lock::new`'s) uses it:
///     lock_runtime::init_with(config)
/// }
/// ```
#[derive(Clone)]
pub struct Config {
    url: String,
    /// A Redis Cluster's seed nodes (the first is `url`); empty for one
    /// server.
    cluster: Vec<String>,
    /// A quorum's (RedLock's) independent masters (the first is `url`);
    /// empty otherwise.
    quorum: Vec<String>,
    /// Redis Sentinel: the sentinels, the master name, the data nodes'
    /// credentials; `None` otherwise.
    sentinel: Option<sentinel::SentinelConfig>,
    connect_timeout: Duration,
    response_timeout: Duration,
    key_prefix: String,
    /// Acknowledged mode: replicas that must confirm each acquisition and
    /// renewal, and how long they are given.
    acknowledged: Option<(u32, Duration)>,
    /// Certificates of the TLS connections (`rediss://`): whom to trust,
    /// whom to show.
    tls: TlsSettings,
    /// The name the holder record gives this client's process (default
    /// `<host name>:<pid>`).
    instance: Option<String>,
    /// A Sentinel option given to a configuration without Sentinel.
    misplaced: Option<&'static str>,
    /// The simulated network every connection is opened on, instead of TCP.
    #[cfg(feature = "simulation")]
    network: Option<Arc<dyn crate::simulation::Network>>,
    /// The seed of the client's random bits, instead of the system's.
    #[cfg(feature = "simulation")]
    random_seed: Option<u64>,
    /// The wall clock the client reads, instead of the system's.
    #[cfg(feature = "simulation")]
    wall_clock: Option<Arc<dyn Fn() -> std::time::SystemTime + Send + Sync>>,
}

impl Config {
    /// Default time allowed to open a connection.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    /// Default time allowed for Redis to answer one command.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
    /// Default prefix of every Redis key the locks use.
    pub const DEFAULT_KEY_PREFIX: &'static str = "lock:";

    /// A configuration for the Redis at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://` for TLS with the `tls-rustls` feature, `redis+unix:///path`).
    ///
    /// A Redis Cluster is named by its seed nodes with
    /// `redis-cluster://[user:password@]host1:port1,host2:port2,...`
    /// (`rediss-cluster://` for TLS), as [`Config::cluster`] does; this
    /// form also works in `REDIS_URL` and [`init`].
    ///
    /// The primary that Redis Sentinel names is reached with
    /// `redis-sentinel://[user:password@]host1:26379,host2:26379,host3:26379/<master name>[/db]`
    /// (`rediss-sentinel://` for TLS to the sentinels and the data nodes),
    /// as [`Config::sentinel`] does: the user and password log in to the
    /// data nodes; sentinels that want a password of their own get it from
    /// the query, `?sentinel_password=...` (and `&sentinel_user=...`).
    pub fn new(url: impl Into<String>) -> Self {
        let url = url.into();
        if let Some(seeds) = several_urls(&url, "cluster") {
            return Config::cluster(seeds);
        }
        if let Some(nodes) = several_urls(&url, "quorum") {
            return Config::quorum(nodes);
        }
        if let Some(sentinel) = sentinel::parse(&url) {
            return Config {
                sentinel: Some(sentinel),
                ..Config::new(String::new())
            }
            .with_url(url);
        }
        Config {
            url,
            cluster: Vec::new(),
            quorum: Vec::new(),
            sentinel: None,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            key_prefix: Self::DEFAULT_KEY_PREFIX.to_owned(),
            acknowledged: None,
            tls: TlsSettings::default(),
            instance: None,
            misplaced: None,
            #[cfg(feature = "simulation")]
            network: None,
            #[cfg(feature = "simulation")]
            random_seed: None,
            #[cfg(feature = "simulation")]
            wall_clock: None,
        }
    }

    /// A configuration for the Redis Cluster with these seed nodes (URLs as
    /// for [`Config::new`]; any reachable primary or replica will do, the
    /// client learns the rest of the cluster from it). Everything else (the
    /// attribute, the manual API, the process-wide client) is unchanged.
    /// Needs Redis 7 or later (sharded pub/sub wakes waiters).
    pub fn cluster<I, S>(seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let seeds: Vec<String> = seeds.into_iter().map(Into::into).collect();
        Config {
            cluster: seeds.clone(),
            ..Config::new(seeds.first().cloned().unwrap_or_default())
        }
    }

    /// A configuration for a quorum of independent Redis masters (RedLock,
    /// [design §13](https://github.com/lock-runtime/lock-runtime/blob/main/docs/design.md)): a lock is held when a majority of them granted
    /// it within its validity. An odd number, at least 3 (checked by
    /// [`Client::new`]); URLs as for [`Config::new`]. The URL form
    /// `redis-quorum://[user:password@]host1:port1,host2:port2,host3:port3`
    /// (`rediss-quorum://` for TLS) works in [`Config::new`], `REDIS_URL`
    /// and [`init`]. Exclusive locks only (with `fencing`, `renew`,
    /// `wait`, ...); no in-process hand-off between tasks.
    pub fn quorum<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(Into::into).collect();
        Config {
            quorum: nodes.clone(),
            ..Config::new(nodes.first().cloned().unwrap_or_default())
        }
    }

    /// A configuration for the primary that Redis Sentinel names: the
    /// sentinels `sentinels` (URLs, `redis://[user:password@]host:port` or
    /// `rediss://` for TLS, with the credentials that sentinel wants; or
    /// `host[:port]`; port 26379 when none is given) are asked for the
    /// primary of `master` (the name in their `sentinel monitor` line), which
    /// is checked with `ROLE`, and followed through failovers: a
    /// `+switch-master` from a sentinel, a `READONLY` answer or a lost
    /// connection moves every connection (calls, waiters' subscriptions) to
    /// the primary they name then, without a restart ([design §15](https://github.com/lock-runtime/lock-runtime/blob/main/docs/design.md)).
    ///
    /// The data nodes get their credentials from
    /// [`primary_credentials`](Self::primary_credentials) and use TLS as the
    /// first sentinel does unless [`primary_tls`](Self::primary_tls) says
    /// otherwise. Everything else (the attribute, the manual API, every
    /// primitive) is unchanged. The URL form
    /// `redis-sentinel://[user:password@]host1:26379,host2:26379/<master>`
    /// does the same in [`Config::new`], [`init`] and `REDIS_URL`.
    ///
    /// Replication to the replicas is asynchronous: a lock the promoted
    /// replica never got is lost in a failover (its holder is told);
    /// [`acknowledged`](Self::acknowledged) mode narrows that window.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_runtime::Config;
    ///
    /// # fn configure() -> Result<(), lock_runtime::LockError> {
    /// let config = Config::sentinel(
    ///     ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .primary_credentials("locker", "secret")
    /// .acknowledged(1, Duration::from_millis(100));
    /// lock_runtime::init_with(config)?;
    /// // The same, as a URL (as `REDIS_URL` too):
    /// let same = lock_runtime::Config::new(
    ///     "redis-sentinel://locker:secret@10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster",
    /// );
    /// # let _ = same;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sentinel<I, S>(sentinels: I, master: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sentinel = sentinel::SentinelConfig::new(sentinels, master.into());
        let first = sentinel.sentinels.first().cloned().unwrap_or_default();
        Config {
            sentinel: Some(sentinel),
            ..Config::new(first)
        }
    }

    /// With Redis Sentinel ([`Config::sentinel`]): the user (empty: the
    /// `default` user) and password the lock calls log in to the data nodes
    /// with. The password never appears in `Debug` output, errors or logs.
    /// Without Sentinel, `Client::new` refuses it: give the credentials in
    /// the URL.
    pub fn primary_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        let user = user.into();
        match &mut self.sentinel {
            Some(sentinel) => {
                sentinel.primary_user = (!user.is_empty()).then_some(user);
                sentinel.primary_password = Some(password.into());
            }
            None => self.misplaced = Some("primary_credentials"),
        }
        self
    }

    /// With Redis Sentinel ([`Config::sentinel`]): whether the data nodes are
    /// reached over TLS (default: as the first sentinel is, by its
    /// `rediss://` URL). Needs the `tls-rustls` feature; the certificates of
    /// [`tls_root_certificates`](Self::tls_root_certificates) and
    /// [`tls_client_certificate`](Self::tls_client_certificate) apply to the
    /// sentinels and the data nodes alike. A data node's certificate must be
    /// valid for the address the sentinels give (an IP address, unless they
    /// announce host names).
    pub fn primary_tls(mut self, tls: bool) -> Self {
        match &mut self.sentinel {
            Some(sentinel) => sentinel.primary_tls = Some(tls),
            None => self.misplaced = Some("primary_tls"),
        }
        self
    }

    /// With Redis Sentinel ([`Config::sentinel`]): the database number on
    /// the data nodes (default 0).
    pub fn primary_db(mut self, db: i64) -> Self {
        match &mut self.sentinel {
            Some(sentinel) => sentinel.primary_db = db,
            None => self.misplaced = Some("primary_db"),
        }
        self
    }

    /// Whether this names the primary of Redis Sentinel ([`Config::sentinel`]).
    pub fn is_sentinel(&self) -> bool {
        self.sentinel.is_some()
    }

    fn with_url(mut self, url: String) -> Self {
        self.url = url;
        self
    }

    /// Whether this names a quorum of independent masters ([`Config::quorum`]).
    pub fn is_quorum(&self) -> bool {
        !self.quorum.is_empty()
    }

    /// Whether this names a Redis Cluster ([`Config::cluster`]).
    pub fn is_cluster(&self) -> bool {
        !self.cluster.is_empty()
    }

    /// A configuration from the `REDIS_URL` environment variable.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoUrl`] when `REDIS_URL` is unset or blank. The URL
    /// itself is checked by [`Client::new`].
    pub fn from_env() -> Result<Self, LockError> {
        match std::env::var(REDIS_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Ok(Config::new(url)),
            _ => Err(ConfigError::NoUrl.into()),
        }
    }

    /// Time allowed to open a connection (default 1 s; from 1 ms to an hour,
    /// checked by [`Client::new`] and [`init_with`]). A Redis that is down
    /// makes an operation fail after about `connect_timeout + response_timeout`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed for Redis to answer one command (default 1 s; from 1 ms
    /// to an hour). Every call is bounded by `connect_timeout +
    /// response_timeout` in all, a reconnect it has to wait for and its
    /// retries included.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Prefix of every Redis key the locks use (default `lock:`), so a lock
    /// `order:42` lives at `lock:{order:42}`.
    /// The prefix may not contain `{` or `}`: the braces after it are the
    /// lock's Redis Cluster hash tag. Such a prefix is rejected by
    /// [`Client::new`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Acknowledged mode: every acquisition (and renewal) waits until at
    /// least `replicas` replicas of the lock's primary have the write
    /// (Redis `WAIT`, in the same round trip), at most `timeout`. An
    /// acquisition they do not confirm in time is given back and fails
    /// with [`LockError::NotReplicated`]; a renewal they do not confirm
    /// counts as failed (tried again while the lock is valid). This narrows,
    /// but does not close, the failover window of asynchronous replication
    /// ([design §12](https://github.com/lock-runtime/lock-runtime/blob/main/docs/design.md)). `timeout` must be shorter than the response
    /// timeout (each call waits for it). In-process hand-offs between tasks
    /// are off in this mode: every holder acquires through Redis.
    pub fn acknowledged(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acknowledged = Some((replicas, timeout));
        self
    }

    /// TLS: trust the certificates of `pem` (one or more PEM
    /// `CERTIFICATE` blocks, typically a private CA's) instead of the
    /// public webpki roots, for every node (a cluster's nodes it discovers
    /// and a quorum's included). Needs `rediss://` URLs and the
    /// `tls-rustls` feature; checked by [`Client::new`] and [`init_with`].
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_certificates = Some(pem.into());
        self
    }

    /// Mutual TLS: show this certificate (`certificate_pem`: the client
    /// certificate, then any intermediate CAs, in PEM) with its private key
    /// (`key_pem`: PKCS#8, PKCS#1 or SEC1 PEM) to every node, for a server
    /// with `tls-auth-clients yes`. The key never appears in `Debug`
    /// output, errors or logs. Needs `rediss://` URLs and the `tls-rustls`
    /// feature; checked (key and certificate belong together) by
    /// [`Client::new`] and [`init_with`].
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// The name of this client's process in its holder record, which
    /// `lockctl list` / `show` print beside each of its locks (with the host,
    /// the process id, the function that took the lock and since when):
    /// e.g. the service and its replica, `"orders-7f9c4-2"`. Default:
    /// `<host name>:<pid>`. Checked by [`Client::new`]: not empty, at most
    /// 256 bytes, no control characters.
    pub fn instance(mut self, name: impl Into<String>) -> Self {
        self.instance = Some(name.into());
        self
    }

    /// Simulation (feature `simulation`, not a public API): every
    /// connection of the client (calls, pub/sub, the sentinels, a cluster's
    /// nodes, a quorum's) is opened on `network` instead of over TCP, to the
    /// addresses the URLs, the sentinels and the slot map name (docs/design.md
    /// §10). Its host name is not read from the system: the holder record says
    /// `simulated`, process id 0 (give each client an
    /// [`instance`](Self::instance)).
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn network(mut self, network: Arc<dyn crate::simulation::Network>) -> Self {
        self.network = Some(network);
        self
    }

    /// Simulation (feature `simulation`, not a public API): the client's
    /// random bits (its id, its notifier's channel, every token, a quorum's
    /// pauses after split votes and the semaphore slots it tries first) come
    /// from a generator seeded with `seed` instead of the operating system:
    /// the same seed, the same bits, in the order the client draws them.
    /// Never for real use: such tokens are predictable.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn random_seed(mut self, seed: u64) -> Self {
        self.random_seed = Some(seed);
        self
    }

    /// Simulation (feature `simulation`, not a public API): the wall clock
    /// the client reads (the holder record's `started_ms` and each hold's
    /// time taken), instead of the system's: the harness's virtual time.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn wall_clock(
        mut self,
        clock: impl Fn() -> std::time::SystemTime + Send + Sync + 'static,
    ) -> Self {
        self.wall_clock = Some(Arc::new(clock));
        self
    }

    /// The URL with its password masked, fit for logs.
    pub fn redacted_url(&self) -> String {
        if let Some(sentinel) = &self.sentinel {
            // The parts (a URL's query may hold the sentinels' password,
            // which `redact_url` would show).
            return sentinel.redacted();
        }
        if self.is_cluster() {
            let seeds: Vec<String> = self.cluster.iter().map(|url| redact_url(url)).collect();
            return format!("cluster [{}]", seeds.join(", "));
        }
        if self.is_quorum() {
            let nodes: Vec<String> = self.quorum.iter().map(|url| redact_url(url)).collect();
            return format!("quorum [{}]", nodes.join(", "));
        }
        redact_url(&self.url)
    }

    /// The server's URL, or each seed node's, parsed, with the TLS
    /// certificates.
    fn parse_urls(&self) -> Result<Vec<redis::Client>, LockError> {
        self.tls
            .check()
            .map_err(|reason| ConfigError::InvalidTls { reason })?;
        if self.sentinel.is_some() {
            return Ok(self
                .sentinel_parts()?
                .0
                .into_iter()
                .map(|(client, _)| client)
                .collect());
        }
        if self.is_cluster() {
            self.cluster
                .iter()
                .map(|url| parse_url(url, &self.tls))
                .collect()
        } else if self.is_quorum() {
            self.quorum
                .iter()
                .map(|url| parse_url(url, &self.tls))
                .collect()
        } else {
            Ok(vec![parse_url(&self.url, &self.tls)?])
        }
    }

    /// With Redis Sentinel: each sentinel's client and `host:port`, and the
    /// settings of the data nodes (credentials, database, TLS and the
    /// certificates; the address is the primary's, filled in later).
    fn sentinel_parts(
        &self,
    ) -> Result<(Vec<(redis::Client, String)>, redis::ConnectionInfo), LockError> {
        let Some(sentinel) = &self.sentinel else {
            return Err(ConfigError::InvalidClientOption {
                option: "sentinel",
                reason: "not a Sentinel configuration".to_owned(),
            }
            .into());
        };
        let invalid = |reason: String| -> LockError {
            ConfigError::InvalidUrl {
                url: self.redacted_url(),
                reason,
                expected: EXPECTED_SENTINEL,
            }
            .into()
        };
        if let Some(reason) = &sentinel.invalid {
            return Err(invalid(reason.clone()));
        }
        if sentinel.master.trim().is_empty() {
            return Err(invalid(
                "no master name: give the name of the sentinels' `sentinel monitor` line"
                    .to_owned(),
            ));
        }
        if sentinel.sentinels.is_empty() {
            return Err(invalid(
                "no sentinel: give at least one (three or more in production)".to_owned(),
            ));
        }
        let primary_tls = sentinel.primary_uses_tls();
        let any_tls = primary_tls
            || sentinel
                .sentinels
                .iter()
                .any(|url| url.to_ascii_lowercase().starts_with("rediss://"));
        if self.tls.is_set() && !any_tls {
            return Err(ConfigError::InvalidTls {
                reason: format!(
                    "TLS certificates were configured, but neither the sentinels nor the data                      nodes of `{}` use TLS: use `rediss-sentinel://` (or `rediss://` sentinels,                      Config::primary_tls), or drop the certificates",
                    self.redacted_url()
                ),
            }
            .into());
        }
        if primary_tls && !tls::BUILT_IN {
            return Err(ConfigError::TlsNotBuiltIn {
                url: self.redacted_url(),
            }
            .into());
        }
        let sentinels = sentinel
            .sentinels
            .iter()
            .map(|url| {
                let client = parse_node_url(url, &self.tls, false)?;
                let address = match client.get_connection_info().addr() {
                    redis::ConnectionAddr::Tcp(host, port)
                    | redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
                    other => format!("{other}"),
                };
                Ok((client, address))
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        // The data nodes' settings: a template whose address is replaced.
        let scheme = if primary_tls { "rediss" } else { "redis" };
        let template = parse_node_url(&format!("{scheme}://127.0.0.1:6379/"), &self.tls, false)?;
        let mut settings = template
            .get_connection_info()
            .redis_settings()
            .clone()
            .set_db(sentinel.primary_db);
        if let Some(user) = &sentinel.primary_user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &sentinel.primary_password {
            settings = settings.set_password(password);
        }
        let primary = template
            .get_connection_info()
            .clone()
            .set_redis_settings(settings);
        Ok((sentinels, primary))
    }

    /// Checks everything but the URL: timeouts in range, a prefix that
    /// keeps the hash tag.
    fn check(&self) -> Result<(), LockError> {
        let invalid = |option: &'static str, reason: String| -> LockError {
            ConfigError::InvalidClientOption { option, reason }.into()
        };
        for (option, timeout) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if timeout < Duration::from_millis(1) || timeout > MAX_TIMEOUT {
                return Err(invalid(
                    option,
                    format!(
                        "{} is out of range: give it from 1 ms to an hour",
                        crate::error::Readable(timeout)
                    ),
                ));
            }
        }
        if self.is_quorum() && (self.quorum.len() < 3 || self.quorum.len().is_multiple_of(2)) {
            return Err(invalid(
                "quorum",
                format!(
                    "{} node(s): give an odd number, at least 3 (an even number adds a node \
                     without adding a failure it survives)",
                    self.quorum.len()
                ),
            ));
        }
        if self.is_quorum() && self.acknowledged.is_some() {
            return Err(invalid(
                "acknowledged",
                "acknowledged mode waits for replicas; a quorum's nodes are independent masters \
                 (a majority already confirms each acquisition): drop `acknowledged`"
                    .to_owned(),
            ));
        }
        if let Some((replicas, timeout)) = self.acknowledged {
            if replicas == 0 {
                return Err(invalid(
                    "acknowledged",
                    "0 replicas confirm nothing: give at least 1".to_owned(),
                ));
            }
            if timeout < Duration::from_millis(1) || timeout >= self.response_timeout {
                return Err(invalid(
                    "acknowledged",
                    format!(
                        "a timeout of {} must be at least 1 ms and shorter than the \
                         response timeout ({}): each call waits for it",
                        crate::error::Readable(timeout),
                        crate::error::Readable(self.response_timeout)
                    ),
                ));
            }
        }
        if let Some(option) = self.misplaced {
            return Err(invalid(
                option,
                "applies to Redis Sentinel's data nodes only (Config::sentinel, \
                 redis-sentinel://): give the credentials, TLS or database in the URL instead"
                    .to_owned(),
            ));
        }
        if let Some(sentinel) = &self.sentinel {
            if sentinel.primary_db < 0 {
                return Err(invalid(
                    "primary_db",
                    format!("{} is not a database number", sentinel.primary_db),
                ));
            }
        }
        if let Some(instance) = &self.instance {
            if instance.is_empty()
                || instance.len() > MAX_INSTANCE_LEN
                || instance.chars().any(char::is_control)
            {
                return Err(invalid(
                    "instance",
                    format!(
                        "`{}` cannot name a process: give from 1 to {MAX_INSTANCE_LEN} bytes \
                         without control characters",
                        instance.escape_debug()
                    ),
                ));
            }
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(invalid(
                "key_prefix",
                format!(
                    "`{}` contains `{{` or `}}`; they are reserved for the lock's hash tag",
                    self.key_prefix
                ),
            ));
        }
        Ok(())
    }
}

/// The longest instance name accepted, in bytes.
const MAX_INSTANCE_LEN: usize = 256;

/// The longest connect or response timeout accepted.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted_url())
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("instance", &self.instance)
            .field("acknowledged", &self.acknowledged)
            .field("tls", &self.tls)
            .finish()
    }
}

/// A handle on one auto-reconnecting, multiplexed Redis connection.
///
/// Cheap to clone; all clones share the connection. Most programs never build
/// one: locks use the process-wide client set up by [`init`] or `REDIS_URL`.
/// Build one with [`Client::new`] to talk to another Redis, or in tests.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::{distributed_lock, Client, Config, Lock, LockError};
///
/// #[derive(Clone)]
/// struct App {
///     locks: Client,
/// }
///
/// // The attribute locks with the client its `client =` names...
/// #[distributed_lock(key = "order:<id>", ttl = "10s", client = app.locks)]
/// async fn settle(app: &App, id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     // Built once at start-up; clones share the connection.
///     let app = App { locks: Client::new(Config::new("redis://127.0.0.1:6380/"))? };
///     settle(&app, 42).await?;
///     // ... and the manual API with `.client(..)`.
///     let total = Lock::new("ledger")
///         .client(app.locks.clone())
///         .ttl(Duration::from_secs(10))
///         .run(async { 40 + 2 })
///         .await?;
///     assert_eq!(total, 42);
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    config: Config,
    /// The backend and everything the client's leases share.
    core: Arc<Core>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Client {
    /// Builds a client. The connection is opened on first use, so this only
    /// fails on a malformed URL. Must be called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`]: a malformed URL ([`ConfigError::InvalidUrl`]),
    /// `rediss://` without TLS built in ([`ConfigError::TlsNotBuiltIn`]), an
    /// option out of range ([`ConfigError::InvalidClientOption`]), or no Tokio
    /// runtime ([`ConfigError::NoRuntime`]). Never a Redis error: nothing is
    /// sent yet.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::{Client, Config};
    ///
    /// let client = Client::new(Config::new("redis://127.0.0.1:6379/").key_prefix("app:lock:"))?;
    /// println!("holder records name this client {}", client.id());
    /// # Ok(()) }
    /// ```
    pub fn new(config: Config) -> Result<Self, LockError> {
        let seeds = config.parse_urls()?;
        config.check()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime.into());
        }
        #[cfg(feature = "tls-rustls")]
        {
            // rustls needs a process-wide crypto provider; keep one that the
            // program installed itself.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        // Each connection opens within the connect timeout, and has no
        // response timeout: each call runs under `Connection::call`'s
        // deadline (connect + response timeout, retries included), which
        // also bounds the wait for a connection to open; a second timer per
        // command inside the connection would only cost time.
        let transport = Transport::tcp(config.connect_timeout);
        let random = Random::default();
        let clock = WallClock::default();
        #[cfg(feature = "simulation")]
        let (transport, random, clock) = (
            match &config.network {
                Some(network) => transport.simulated(Arc::clone(network)),
                None => transport,
            },
            config.random_seed.map_or(random, Random::seeded),
            config
                .wall_clock
                .clone()
                .map_or(clock, WallClock::from_hook),
        );
        #[cfg(feature = "simulation")]
        let simulated = config.network.is_some();
        #[cfg(not(feature = "simulation"))]
        let simulated = false;
        let acknowledged = config.acknowledged.map(|(replicas, timeout)| Ack {
            replicas,
            timeout_ms: timeout.as_millis() as u64,
        });
        let set_up =
            |target: CallTarget| RedisBackend::new(target, call_deadline(&config), acknowledged);
        // With Sentinel: the primary it names, shared by every connection
        // of the client (calls, the acknowledged pool, the notifier).
        let sentinels = if config.is_sentinel() {
            let (nodes, primary) = config.sentinel_parts()?;
            let master = config
                .sentinel
                .as_ref()
                .map(|sentinel| sentinel.master.clone())
                .unwrap_or_default();
            Some(Sentinels::new(
                nodes,
                master,
                primary,
                transport.clone(),
                call_deadline(&config),
            ))
        } else {
            None
        };
        let backend: Arc<dyn Backend> = if let Some(sentinels) = &sentinels {
            Arc::new(set_up(CallTarget::Sentinel(Arc::clone(sentinels))))
        } else if config.is_cluster() {
            // Calls go to each primary through the router; nothing below
            // `Connection::call` retries (it knows a retry for one).
            Arc::new(set_up(CallTarget::Cluster(
                seeds
                    .iter()
                    .map(|seed| seed.get_connection_info().clone())
                    .collect(),
                transport.clone(),
                call_deadline(&config),
                Switches::new(call_deadline(&config)),
            )))
        } else if config.is_quorum() {
            // The same node twice would count twice towards a majority.
            let mut distinct = std::collections::HashSet::new();
            for node in &seeds {
                let info = node.get_connection_info();
                if !distinct.insert((info.addr().to_string(), info.redis_settings().db())) {
                    return Err(ConfigError::InvalidUrl {
                        url: config.redacted_url(),
                        reason: format!("the quorum names the node {} more than once", info.addr()),
                        expected: "N distinct nodes",
                    }
                    .into());
                }
            }
            let nodes = seeds
                .iter()
                .map(|node| {
                    let backend =
                        set_up(CallTarget::Node(Box::new(node.clone()), transport.clone()))
                            .quorum_node();
                    // `host:port`: never the credentials.
                    Ok((backend, node.get_connection_info().addr().to_string()))
                })
                .collect::<Result<Vec<_>, LockError>>()?;
            Arc::new(QuorumBackend::new(
                nodes,
                call_deadline(&config),
                random.clone(),
            ))
        } else {
            Arc::new(set_up(CallTarget::Node(
                Box::new(seeds[0].clone()),
                transport.clone(),
            )))
        };
        let listen = if let Some(sentinels) = sentinels {
            Listen::Sentinel(sentinels)
        } else if config.is_cluster() {
            Listen::Cluster(
                seeds
                    .iter()
                    .map(|seed| seed.get_connection_info().clone())
                    .collect(),
            )
        } else if config.is_quorum() {
            Listen::Quorum(seeds)
        } else {
            Listen::Node(seeds)
        };
        let identity = Identity::new(
            random.client_id()?,
            config.instance.clone(),
            &clock,
            simulated,
        );
        let notifier = Notifier::new(listen, transport, call_deadline(&config), &random)?;
        let core = Core::new(
            backend,
            notifier,
            config.key_prefix.clone(),
            identity,
            random,
            clock,
        );
        Ok(Client {
            inner: Arc::new(ClientInner { config, core }),
        })
    }

    /// The configuration this client was built with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This client's id: 16 hex digits drawn when it was built, the end of
    /// every token it hands out ([`HeldLock::token`](crate::HeldLock::token))
    /// and the hash tag of its holder record (`<prefix>client:{<id>}`), where
    /// lockctl finds which process holds a lock.
    pub fn id(&self) -> &str {
        self.inner.core.client_id()
    }

    /// The name of this client's process in its holder record
    /// ([`Config::instance`], default `<host name>:<pid>`).
    pub fn instance(&self) -> &str {
        &self.inner.core.holders().identity().instance
    }

    /// Counters of this client's renewal driver.
    pub fn renewal_stats(&self) -> RenewalStats {
        self.inner.core.renewer().stats()
    }

    /// How many tasks of this client wait in the process for the lock
    /// `name`, queued behind the one of them that holds it or waits for it
    /// in Redis (see the guide,
    /// [Waiting and hand-off](crate::guide::attribute#waiting-and-hand-off)).
    /// 0 for an invalid name.
    pub fn waiting_in_process(&self, name: &str) -> usize {
        LockKeys::new(self.key_prefix(), name, "")
            .map_or(0, |keys| self.inner.core.cohorts().waiting(&keys.lock))
    }

    /// Simulation (feature `simulation`, not a public API): the number of
    /// the last switch of primary this client learned of, changing as it
    /// learns of each (`None` on one server or a quorum): for the
    /// simulation's checkers.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn switches_learned(&self) -> Option<crate::signal::Changes> {
        self.inner
            .core
            .backend()
            .switches()
            .map(|switches| switches.subscribe())
    }

    /// Simulation (feature `simulation`, not a public API): whether the
    /// switch numbered `number` that this client learned of concerns the
    /// lock `name` (on a cluster, its key's slot; every key with Sentinel).
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn switch_concerns(&self, number: u64, name: &str) -> bool {
        let Some(switches) = self.inner.core.backend().switches() else {
            return false;
        };
        let Ok(keys) = LockKeys::new(self.key_prefix(), name, "") else {
            return false;
        };
        let slot = crate::transport::cluster::slots::slot(&keys.lock);
        switches
            .since(number.saturating_sub(1))
            .first()
            .is_some_and(|switch| switch.number == number && switch.concerns(Some(slot)))
    }

    /// What this client's leases share: its backend, renewal driver,
    /// notifier and cohorts.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    pub(crate) fn key_prefix(&self) -> &str {
        &self.inner.config.key_prefix
    }
}

/// The longest one Redis call may take: connect plus response timeout.
fn call_deadline(config: &Config) -> Duration {
    config.connect_timeout + config.response_timeout
}

static GLOBAL_CONFIG: OnceLock<Config> = OnceLock::new();
/// The process-wide clients, one per Tokio runtime that used them: a
/// connection's I/O task lives on the runtime that opened it and dies with
/// it, so a program with several runtimes (or a test suite where each
/// `#[tokio::test]` has its own) gets a working connection on each.
static GLOBAL_CLIENTS: LazyLock<Mutex<Vec<(tokio::runtime::Id, Client)>>> =
    LazyLock::new(|| Mutex::new(Vec::new()));

/// Configures the process-wide client with the Redis at `url`.
///
/// Call it once at start-up, before the first lock is taken. Without it, the
/// first lock reads `REDIS_URL`.
///
/// ```no_run
/// use lock_runtime::{distributed_lock, LockError};
///
/// #[distributed_lock(key = "nightly", ttl = "1m")]
/// async fn nightly() -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     // Once, before the first lock: every `#[distributed_lock]` and
///     // `Lock::new` without a client of its own uses this Redis.
///     lock_runtime::init("redis://127.0.0.1:6379/")?;
///     nightly().await
/// }
/// ```
///
/// # Errors
///
/// [`LockError::Config`]: a malformed URL, or [`ConfigError::LateInit`] when
/// the process-wide client was already configured or already in use.
pub fn init(url: impl Into<String>) -> Result<(), LockError> {
    init_with(Config::new(url))
}

/// Configures the process-wide client with a full [`Config`].
///
/// # Errors
///
/// As [`init`], and an option out of range
/// ([`ConfigError::InvalidClientOption`]).
pub fn init_with(config: Config) -> Result<(), LockError> {
    config.parse_urls()?;
    config.check()?;
    let redacted = config.redacted_url();
    if !global_clients().is_empty() {
        return Err(ConfigError::LateInit {
            reason: "was called after the first lock was taken".to_owned(),
        }
        .into());
    }
    GLOBAL_CONFIG.set(config).map_err(|_| {
        ConfigError::LateInit {
            reason: format!("was called twice (second URL `{redacted}`)"),
        }
        .into()
    })
}

fn global_clients() -> MutexGuard<'static, Vec<(tokio::runtime::Id, Client)>> {
    GLOBAL_CLIENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process-wide client for the current Tokio runtime, built on first use
/// from [`init`]'s configuration or from `REDIS_URL`. One connection (and one
/// renewal driver) per runtime; most programs have exactly one runtime. A
/// runtime's client is dropped when the runtime shuts down, so a program (or
/// a test suite) that creates runtime after runtime does not accumulate
/// connections or file descriptors.
///
/// # Errors
///
/// [`ConfigError::NoRuntime`] outside a Tokio runtime; [`ConfigError::NoUrl`]
/// without [`init`] or `REDIS_URL`; the errors of [`Client::new`].
pub fn global_client() -> Result<Client, LockError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
    let id = runtime.id();
    let client = {
        let mut clients = global_clients();
        if let Some((_, client)) = clients.iter().find(|(known, _)| *known == id) {
            return Ok(client.clone());
        }
        let config = match GLOBAL_CONFIG.get() {
            Some(config) => config.clone(),
            None => Config::from_env()?,
        };
        let client = Client::new(config)?;
        clients.push((id, client.clone()));
        client
    };
    // A task that never ends on its own: the runtime drops it when it shuts
    // down, and with it this runtime's client. Spawned after the list is
    // unlocked, since a runtime already shutting down drops it at once.
    let forget = ForgetOnDrop(id);
    runtime.spawn(async move {
        let _forget = forget;
        std::future::pending::<()>().await;
    });
    Ok(client)
}

/// Removes a runtime's process-wide client when dropped.
struct ForgetOnDrop(tokio::runtime::Id);

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        let removed = {
            let mut clients = global_clients();
            clients
                .iter()
                .position(|(id, _)| *id == self.0)
                .map(|at| clients.swap_remove(at))
        };
        drop(removed); // outside the lock
    }
}

/// The client of one server's URL, with the TLS certificates when they
/// were given (they need a `rediss://` URL).
fn parse_url(url: &str, tls: &TlsSettings) -> Result<redis::Client, LockError> {
    parse_node_url(url, tls, true)
}

/// [`parse_url`]; with `certificates_need_tls` false, certificates do not
/// make a `redis://` URL an error (Sentinel: the sentinels or the data
/// nodes may be the ones with TLS, checked as a whole).
fn parse_node_url(
    url: &str,
    tls: &TlsSettings,
    certificates_need_tls: bool,
) -> Result<redis::Client, LockError> {
    let scheme = url.split("://").next().unwrap_or_default();
    if url.contains("://")
        && !ACCEPTED_SCHEMES
            .iter()
            .any(|s| scheme.eq_ignore_ascii_case(s))
    {
        let hint = if scheme.to_ascii_lowercase().contains("sentinel") {
            " (for Redis Sentinel write `redis-sentinel://host1:26379,host2:26379/<master name>`, \
             or use Config::sentinel)"
        } else {
            ""
        };
        return Err(ConfigError::InvalidUrl {
            url: redact_url(url),
            reason: format!(
                "its scheme `{scheme}` is not one this library takes{hint}; the schemes it takes \
                 are {}",
                ACCEPTED_SCHEMES.join(", ")
            ),
            expected: EXPECTED_URL,
        }
        .into());
    }
    let uses_tls = scheme.eq_ignore_ascii_case("rediss");
    if uses_tls && !tls::BUILT_IN {
        return Err(ConfigError::TlsNotBuiltIn {
            url: redact_url(url),
        }
        .into());
    }
    if uses_tls && tls::is_insecure(url) {
        return Err(ConfigError::InvalidTls {
            reason: format!(
                "`{}` turns off the check of the server's certificate (`#insecure`), which this \
                 library does not do: give the CA that signed the server's certificate to \
                 Config::tls_root_certificates instead",
                redact_url(url)
            ),
        }
        .into());
    }
    if tls.is_set() && !uses_tls && certificates_need_tls {
        return Err(ConfigError::InvalidTls {
            reason: format!(
                "TLS certificates were configured, but `{}` does not use TLS: use a `rediss://` \
                 URL (`rediss-cluster://`, `rediss-quorum://`), or drop the certificates",
                redact_url(url)
            ),
        }
        .into());
    }
    let invalid = |error: redis::RedisError| -> LockError {
        ConfigError::InvalidUrl {
            url: redact_url(url),
            reason: error.kind_description().to_owned(),
            expected: EXPECTED_URL,
        }
        .into()
    };
    #[cfg(feature = "tls-rustls")]
    if let Some(certificates) = tls.certificates().filter(|_| uses_tls) {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info().map_err(invalid)?;
        return redis::Client::build_with_tls(info, certificates).map_err(|error| {
            ConfigError::InvalidTls {
                reason: format!(
                    "cannot set up TLS for `{}` with the configured certificates ({})",
                    redact_url(url),
                    error.kind_description()
                ),
            }
            .into()
        });
    }
    redis::Client::open(url).map_err(invalid)
}

/// Every URL scheme [`Config::new`] takes (the `-cluster`, `-quorum` and
/// `-sentinel` ones are split into node URLs before [`parse_node_url`]).
const ACCEPTED_SCHEMES: [&str; 10] = [
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis-cluster",
    "rediss-cluster",
    "redis-quorum",
    "rediss-quorum",
    "redis-sentinel",
    "rediss-sentinel",
];

/// The URL forms a [`ConfigError::InvalidUrl`] names.
const EXPECTED_URL: &str = "redis://[user:password@]host[:port][/db], rediss://... for TLS, \
     redis-cluster://host1:port1,host2:port2, redis-quorum://host1:port1,host2:port2,host3:port3 \
     or redis-sentinel://host1:26379,host2:26379,host3:26379/mastername";

/// The form a [`ConfigError::InvalidUrl`] of a Sentinel configuration names.
const EXPECTED_SENTINEL: &str = "redis-sentinel://[user:password@]host1:26379,host2:26379,\
     host3:26379/<master name>[/db][?sentinel_password=...] (rediss-sentinel:// for TLS), or \
     Config::sentinel([\"host1:26379\", ...], \"<master name>\")";

/// The seed node URLs of a `redis-cluster://` (or `rediss-cluster://`) URL:
/// `redis-cluster://user:pw@h1:p1,h2:p2` gives `redis://user:pw@h1:p1`
/// and `redis://user:pw@h2:p2`. `None` for any other URL.
/// The node URLs of a `redis-<kind>://` / `rediss-<kind>://` URL (`kind`:
/// `cluster` or `quorum`) naming several hosts.
fn several_urls(url: &str, kind: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let scheme = match scheme.strip_suffix(kind)?.strip_suffix('-')? {
        "redis" => "redis",
        "rediss" => "rediss",
        _ => return None,
    };
    // The hosts end at the path (`/db`) or query; a cluster has only
    // database 0 (the cluster client ignores them), a quorum's nodes each
    // get them.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (rest, tail) = rest.split_at(end);
    let tail = match (kind, tail) {
        ("quorum", tail) if !tail.is_empty() => tail.to_owned(),
        _ => "/".to_owned(),
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    Some(
        hosts
            .split(',')
            .filter(|host| !host.trim().is_empty())
            .map(|host| format!("{scheme}://{userinfo}{}{tail}", host.trim()))
            .collect(),
    )
}

trait KindDescription {
    fn kind_description(&self) -> String;
}

impl KindDescription for redis::RedisError {
    /// The error's kind and detail, without echoing the URL back.
    fn kind_description(&self) -> String {
        match self.detail() {
            Some(detail) => format!("{:?}: {detail}", self.kind()),
            None => format!("{:?}", self.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(not(feature = "tls-rustls"))]
    const CERTIFICATE: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    /// Without the feature, `rediss://` and certificates are `Config`
    /// errors naming the feature. (Only in a build without it: the tests
    /// package turns it on, and Cargo unifies features across a workspace
    /// build, so `scripts/test.sh` also runs `cargo test -p lock-runtime
    /// --lib` on its own.)
    #[cfg(not(feature = "tls-rustls"))]
    #[test]
    fn without_the_feature_rediss_and_certificates_say_how_to_get_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        for url in [
            "rediss://user:hunter2@127.0.0.1:6380/",
            "rediss-cluster://user:hunter2@127.0.0.1:6380,127.0.0.1:6381",
            "rediss-quorum://user:hunter2@127.0.0.1:6380,127.0.0.1:6381,127.0.0.1:6382",
        ] {
            let error = crate::Client::new(crate::Config::new(url)).expect_err("no TLS");
            let message = error.to_string();
            assert!(
                message.contains("TLS") && message.contains("`tls-rustls` feature"),
                "{message}"
            );
            assert!(!message.contains("not a valid Redis URL"), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        let error = crate::Client::new(
            crate::Config::new("redis://127.0.0.1:6380/").tls_root_certificates(CERTIFICATE),
        )
        .expect_err("no TLS");
        assert!(
            error.to_string().contains("`tls-rustls` feature"),
            "{error}"
        );
    }
}
