//! Redis Sentinel: the primary of a master name, asked of the sentinels,
//! checked with `ROLE`, and followed through failovers (docs/design.md
//! §15).
//!
//! [`Sentinels`] knows the primary of one master name. Every connection of
//! a client (the lock calls' [`SentinelLink`], each connection of the
//! acknowledged pool, the notifier's pub/sub) opens to the primary it
//! names, and reports back what makes the primary doubtful:
//!
//! - a connection that fails or is closed (the primary died, or a
//!   sentinel reconfigured it and closed its clients), or a `READONLY`
//!   answer (it was demoted): [`Sentinels::suspect`]. The next connection
//!   checks the primary with `ROLE` first; when it is not (or cannot be
//!   reached), the sentinels are asked again;
//! - a sentinel's `+switch-master` message (every sentinel is subscribed
//!   to, by a task of the client): the new primary is taken at once, and
//!   every connection moves to it on its next call (the notifier at once),
//!   without waiting for the old primary to fail a call: after a manual
//!   `SENTINEL FAILOVER` the old primary goes on accepting writes until a
//!   sentinel converts it to a replica, seconds later.
//!
//! The sentinels are all asked at once; once a majority answered (or every
//! one answered or failed), the primary named with the highest
//! configuration epoch is checked with `ROLE` first, then the others. A
//! sentinel that is down or stalled is passed over, not waited for. When
//! no sentinel names a primary that answers `ROLE` as one, the call fails
//! with an error that says what each sentinel said ([`NoPrimary`]).
//!
//! Why not the `redis` crate's `sentinel` module: its lookup returns the
//! last sentinel's error alone (the issue asks for each sentinel to be
//! named), runs under the crate's default timeouts rather than the client's,
//! and has no `+switch-master` subscription; what it would do for us here
//! is one `SENTINEL` command and one `ROLE`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisResult, Value};
use tokio::sync::watch;

use crate::error::NoPrimary;
use crate::transport::switches::Switches;
use crate::transport::{within, Transport, Wire};

/// How long the answers of the sentinels beyond a majority are waited for:
/// a sentinel that is slow or stalled is not waited for longer.
const GRACE: Duration = Duration::from_millis(100);

/// The pause before a sentinel's `+switch-master` subscription is tried
/// again after it failed or was closed.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(500);

/// The sentinels' channel where each announces the primaries it switched.
const SWITCH_MASTER: &str = "+switch-master";

/// The primary of one master name, as the sentinels name it.
pub(crate) struct Sentinels {
    nodes: Vec<Node>,
    master: String,
    /// The data nodes' settings (credentials, database, TLS and its
    /// certificates); its address is replaced by the primary's.
    primary_settings: ConnectionInfo,
    /// How every connection is opened: within the connect timeout; no
    /// response timeout (each call runs under `Connection::call`'s deadline).
    transport: Transport,
    /// The longest a sentinel's answer or a `ROLE` check may take.
    deadline: Duration,
    state: Mutex<State>,
    /// `state.epoch`, read on every call without the lock.
    epoch: AtomicU64,
    /// Each new epoch, for the notifier to move its subscription.
    changed: watch::Sender<u64>,
    /// One resolution at a time.
    resolving: tokio::sync::Mutex<()>,
    /// The task subscribed to every sentinel's `+switch-master`.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Each switch from a primary to another (not the first one found),
    /// for the writes sent to the old one to be made good on the new one.
    switches: Arc<Switches>,
}

/// One sentinel.
struct Node {
    client: redis::Client,
    /// `host:port`, for messages (never the credentials).
    address: String,
    /// Its connection, kept between resolutions.
    connection: Mutex<Option<Wire>>,
}

/// What is known of the primary.
struct State {
    /// Its host and port.
    primary: Option<(String, u16)>,
    /// `ROLE` confirmed it since the last doubt.
    verified: bool,
    /// Raised each time the primary changes: connections opened in an
    /// earlier epoch are opened again.
    epoch: u64,
}

/// What a sentinel said of the master.
struct Named {
    host: String,
    port: u16,
    config_epoch: u64,
}

impl Sentinels {
    /// The sentinels `nodes` (each a client and its `host:port`) of the
    /// master `master`, whose data nodes are reached with
    /// `primary_settings`.
    pub(crate) fn new(
        nodes: Vec<(redis::Client, String)>,
        master: String,
        primary_settings: ConnectionInfo,
        transport: Transport,
        deadline: Duration,
    ) -> Arc<Sentinels> {
        Arc::new(Sentinels {
            nodes: nodes
                .into_iter()
                .map(|(client, address)| Node {
                    client,
                    address,
                    connection: Mutex::new(None),
                })
                .collect(),
            master,
            primary_settings,
            transport,
            deadline,
            state: Mutex::new(State {
                primary: None,
                verified: false,
                epoch: 0,
            }),
            epoch: AtomicU64::new(0),
            changed: watch::Sender::new(0),
            resolving: tokio::sync::Mutex::new(()),
            watcher: Mutex::new(None),
            switches: Switches::new(deadline),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current epoch: a connection opened in another is stale.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Each change of the primary, as its new epoch.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The switches of primary learned of (`+switch-master`, or a new
    /// primary found after a doubt).
    pub(crate) fn switches(&self) -> Arc<Switches> {
        Arc::clone(&self.switches)
    }

    /// The database of the data nodes.
    pub(crate) fn db(&self) -> i64 {
        self.primary_settings.redis_settings().db()
    }

    /// How a connection to a data node is opened.
    pub(crate) fn transport(&self) -> &Transport {
        &self.transport
    }

    /// `sentinel mymaster of [h1:26379, h2:26379]`, for messages.
    pub(crate) fn describe(&self) -> String {
        let nodes: Vec<&str> = self
            .nodes
            .iter()
            .map(|node| node.address.as_str())
            .collect();
        format!("sentinel {} of [{}]", self.master, nodes.join(", "))
    }

    /// A connection to the primary of epoch `epoch` failed, closed, or was
    /// answered `READONLY`: the next connection checks it first.
    pub(crate) fn suspect(&self, epoch: u64) {
        let mut state = self.state();
        if state.epoch == epoch {
            state.verified = false;
        }
    }

    /// A connection stopped answering: the primary it talks to is in doubt.
    pub(crate) fn suspect_current(&self) {
        self.state().verified = false;
    }

    /// A sentinel switched the master to `host:port` (its `+switch-master`):
    /// every connection moves there (checked with `ROLE` first).
    fn switched(&self, host: String, port: u16) {
        let mut state = self.state();
        if state.primary.as_ref() == Some(&(host.clone(), port)) {
            return;
        }
        tracing::info!(
            master = %self.master,
            primary = %format!("{host}:{port}"),
            "Redis Sentinel switched the primary; moving the lock connections there"
        );
        let had = state.primary.replace((host, port)).is_some();
        self.raise(&mut state);
        drop(state);
        if had {
            self.switches.switched(None);
        }
    }

    /// A new epoch: unverified, every connection opened again.
    fn raise(&self, state: &mut State) {
        state.verified = false;
        state.epoch += 1;
        self.epoch.store(state.epoch, Ordering::Release);
        self.changed.send_replace(state.epoch);
    }

    /// The primary in `seen` (the epoch a resolution started in) is
    /// `host:port`, checked: taken, unless the state changed meanwhile (a
    /// switch: then `None`, and the resolution starts again).
    fn settle(&self, seen: u64, host: &str, port: u16) -> Option<u64> {
        let mut state = self.state();
        if state.epoch != seen {
            return None;
        }
        if state.primary.as_ref().map(|(h, p)| (h.as_str(), *p)) != Some((host, port)) {
            if let Some((old_host, old_port)) = &state.primary {
                tracing::info!(
                    master = %self.master,
                    primary = %format!("{host}:{port}"),
                    was = %format!("{old_host}:{old_port}"),
                    "Redis Sentinel names a new primary; moving the lock connections there"
                );
            }
            let had = state.primary.replace((host.to_owned(), port)).is_some();
            self.raise(&mut state);
            if had {
                self.switches.switched(None);
            }
        }
        state.verified = true;
        Some(state.epoch)
    }

    /// The client of the data node at `host:port`, with the data nodes'
    /// settings.
    pub(crate) fn client_for(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let addr = match self.primary_settings.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        redis::Client::open(self.primary_settings.clone().set_addr(addr))
    }

    /// The primary's client and its epoch: the known one if nothing put it
    /// in doubt; else the known one checked with `ROLE`; else the one the
    /// sentinels name, checked.
    pub(crate) async fn primary(self: &Arc<Self>) -> RedisResult<(u64, redis::Client)> {
        self.ensure_watcher();
        for _ in 0..3 {
            if let Some(found) = self.verified()? {
                return Ok(found);
            }
            let _resolving = self.resolving.lock().await;
            if let Some(found) = self.verified()? {
                return Ok(found);
            }
            let (seen, known) = {
                let state = self.state();
                (state.epoch, state.primary.clone())
            };
            let mut doubts = Vec::new();
            if let Some((host, port)) = &known {
                match self.check(host, *port).await {
                    Ok(()) => match self.settle(seen, host, *port) {
                        Some(epoch) => return Ok((epoch, self.client_for(host, *port)?)),
                        None => continue,
                    },
                    Err(refusal) => doubts.push(format!(
                        "{host}:{port}, the primary so far, {}",
                        refusal.why
                    )),
                }
            }
            let (host, port) = self.ask(doubts).await?;
            if let Some(epoch) = self.settle(seen, &host, port) {
                return Ok((epoch, self.client_for(&host, port)?));
            }
        }
        // The primary switched three times during one resolution.
        Err(NoPrimary {
            master: self.master.clone(),
            reports: vec!["the primary kept changing while it was looked up".to_owned()],
            login_refused: false,
            unknown_master: false,
        }
        .into())
    }

    /// The known primary, if `ROLE` confirmed it since the last doubt.
    fn verified(&self) -> RedisResult<Option<(u64, redis::Client)>> {
        let state = self.state();
        match &state.primary {
            Some((host, port)) if state.verified => {
                Ok(Some((state.epoch, self.client_for(host, *port)?)))
            }
            _ => Ok(None),
        }
    }

    /// Asks the sentinels for the primary after a `+switch-master` may
    /// have been missed (a subscription closed and made again): a primary
    /// they name that is not the known one is taken.
    async fn refresh(self: &Arc<Self>) {
        let _resolving = self.resolving.lock().await;
        let (seen, known) = {
            let state = self.state();
            (state.epoch, state.primary.clone())
        };
        if let Ok((host, port)) = self.ask(Vec::new()).await {
            if known.as_ref() != Some(&(host.clone(), port)) {
                self.settle(seen, &host, port);
            }
        }
    }

    /// Whether the data node at `host:port` is a primary (`ROLE`); if not,
    /// why, in words.
    async fn check(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let check = async {
            let client = self.client_for(host, port)?;
            let mut connection = self.transport.connect(&client).await?;
            redis::cmd("ROLE")
                .query_async::<redis::Role>(&mut connection)
                .await
        };
        let why = match within(self.deadline, check).await {
            Ok(redis::Role::Primary { .. }) => return Ok(()),
            Ok(redis::Role::Replica { .. }) => "is a replica".to_owned(),
            Ok(redis::Role::Sentinel { .. }) => "is a sentinel, not a data node".to_owned(),
            Ok(_) => "answered `ROLE` with an unknown role".to_owned(),
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
            {
                format!("refused `ROLE` to the Redis user ({error}): add `+role` to its ACL rule")
            }
            Err(error) if error.kind() == redis::ErrorKind::AuthenticationFailed => {
                return Err(Refusal::login(format!(
                    "refused the login ({error}): check the user and password of the data \
                     nodes (the URL's, or `primary_credentials`)"
                )))
            }
            Err(error) => format!("cannot be checked ({error})"),
        };
        Err(Refusal::other(why))
    }

    /// Asks every sentinel at once; checks, in the order of their
    /// configuration epochs (highest first), the primaries named by those
    /// that answered until a majority did (and a moment more); returns the
    /// first that is one. `doubts`: what was found already.
    async fn ask(&self, doubts: Vec<String>) -> RedisResult<(String, u16)> {
        let mut asks: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| async move { (node, self.ask_one(node).await) })
            .collect();
        let majority = self.nodes.len() / 2 + 1;
        let mut named: Vec<(&Node, Named)> = Vec::new();
        let mut reports: Vec<String> = Vec::new();
        // Refusals of the login: when everyone refused it, the error says
        // so and is not retried.
        let mut logins_refused = 0;
        // Sentinels that monitor no master of this name.
        let mut unknown = 0;
        // Once a majority answered, the others are given a moment more.
        let mut until: Option<tokio::time::Instant> = None;
        loop {
            let next = match until {
                Some(until) => match tokio::time::timeout_at(until, asks.next()).await {
                    Ok(next) => next,
                    Err(_elapsed) => break,
                },
                None => asks.next().await,
            };
            match next {
                None => break,
                Some((node, Ok(answer))) => {
                    named.push((node, answer));
                    if named.len() >= majority && until.is_none() {
                        until = Some(tokio::time::Instant::now() + GRACE);
                    }
                }
                Some((node, Err(refusal))) => {
                    logins_refused += usize::from(refusal.login);
                    unknown += usize::from(refusal.unknown_master);
                    reports.push(format!("sentinel {} {}", node.address, refusal.why));
                }
            }
        }
        // Still asked: said once each.
        let answered: Vec<&str> = named
            .iter()
            .map(|(node, _)| node.address.as_str())
            .collect();
        for node in &self.nodes {
            let told = reports
                .iter()
                .any(|report| report.starts_with(&format!("sentinel {} ", node.address)));
            if !told && !answered.contains(&node.address.as_str()) {
                reports.push(format!(
                    "sentinel {} had not answered when the others had",
                    node.address
                ));
            }
        }
        named.sort_by_key(|(_, answer)| std::cmp::Reverse(answer.config_epoch));
        let mut tried: Vec<(String, u16)> = Vec::new();
        let mut checks: Vec<String> = Vec::new();
        let mut primaries_refused = 0;
        for (_, answer) in &named {
            let address = (answer.host.clone(), answer.port);
            if tried.contains(&address) {
                continue;
            }
            tried.push(address);
            match self.check(&answer.host, answer.port).await {
                Ok(()) => return Ok((answer.host.clone(), answer.port)),
                Err(refusal) => {
                    primaries_refused += usize::from(refusal.login);
                    let namers: Vec<String> = named
                        .iter()
                        .filter(|(_, other)| other.host == answer.host && other.port == answer.port)
                        .map(|(node, _)| format!("sentinel {}", node.address))
                        .collect();
                    checks.push(format!(
                        "{}:{}, named by {} (config epoch {}), {}",
                        answer.host,
                        answer.port,
                        namers.join(" and "),
                        answer.config_epoch,
                        refusal.why
                    ));
                }
            }
        }
        let login_refused = if named.is_empty() {
            logins_refused == self.nodes.len()
        } else {
            primaries_refused == tried.len()
        };
        let mut all = doubts;
        all.extend(checks);
        all.extend(reports);
        Err(NoPrimary {
            master: self.master.clone(),
            reports: all,
            login_refused,
            unknown_master: named.is_empty() && unknown >= majority,
        }
        .into())
    }

    /// One sentinel's answer: `SENTINEL MASTER <name>`, on its kept
    /// connection (opened if need be), within the deadline.
    async fn ask_one(&self, node: &Node) -> Result<Named, Refusal> {
        let ask = async {
            let kept = node
                .connection
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone();
            let mut connection = match kept {
                Some(connection) => connection,
                None => {
                    let connection = self.transport.connect(&node.client).await?;
                    *node
                        .connection
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                        Some(connection.clone());
                    connection
                }
            };
            let reply = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.master)
                .query_async::<HashMap<String, String>>(&mut connection)
                .await;
            if reply.as_ref().is_err_and(|error| {
                error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_unrecoverable_error()
            }) {
                node.connection
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take();
            }
            reply
        };
        let fields = match within(self.deadline, ask).await {
            Ok(fields) => fields,
            Err(error) if error.is_timeout() => {
                node.connection
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take();
                return Err(Refusal::other(format!(
                    "did not answer within {}",
                    crate::error::Readable(self.deadline)
                )));
            }
            Err(error) if error.to_string().contains("No such master") => {
                return Err(Refusal::unknown_master(format!(
                    "does not monitor a master named `{}`",
                    self.master
                )))
            }
            Err(error) if error.kind() == redis::ErrorKind::AuthenticationFailed => {
                return Err(Refusal::login(format!(
                    "refused the login ({error}): check the sentinels' user and password \
                     (`sentinel_user`, `sentinel_password`, or the sentinel's own URL)"
                )))
            }
            Err(error) => return Err(Refusal::other(format!("could not be asked ({error})"))),
        };
        let host = fields.get("ip").cloned();
        let port = fields.get("port").and_then(|port| port.parse::<u16>().ok());
        match (host, port) {
            (Some(host), Some(port)) => Ok(Named {
                host,
                port,
                config_epoch: fields
                    .get("config-epoch")
                    .and_then(|epoch| epoch.parse().ok())
                    .unwrap_or(0),
            }),
            _ => Err(Refusal::other(format!(
                "gave no address for `{}` (flags {})",
                self.master,
                fields.get("flags").map_or("unknown", String::as_str)
            ))),
        }
    }

    /// Starts the task subscribed to the sentinels' `+switch-master` if it
    /// does not run (first use, or the runtime it ran on has shut down).
    fn ensure_watcher(self: &Arc<Self>) {
        let mut watcher = self
            .watcher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if watcher.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let sentinels = Arc::downgrade(self);
        let count = self.nodes.len();
        *watcher = Some(runtime.spawn(async move {
            let watches = (0..count).map(|index| watch_switches(sentinels.clone(), index));
            futures_util::future::join_all(watches).await;
        }));
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        // The watcher would otherwise wait on the sentinels for good.
        let watcher = self
            .watcher
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(watcher) = watcher.take() {
            watcher.abort();
        }
    }
}

/// Listens on sentinel number `index` for `+switch-master` of the master,
/// while the client lives; subscribes again after a failure (then asks the
/// sentinels: a switch may have been missed meanwhile).
async fn watch_switches(sentinels: Weak<Sentinels>, index: usize) {
    let mut missed = false;
    loop {
        let Some(this) = sentinels.upgrade() else {
            return;
        };
        let (client, deadline, master, transport) = (
            this.nodes[index].client.clone(),
            this.deadline,
            this.master.clone(),
            this.transport.clone(),
        );
        drop(this);
        let subscribed = within(deadline, async {
            let mut pubsub = transport.pubsub(&client).await?;
            pubsub.subscribe(SWITCH_MASTER).await?;
            Ok(pubsub)
        })
        .await;
        if let Ok(pubsub) = subscribed {
            if missed {
                let Some(this) = sentinels.upgrade() else {
                    return;
                };
                this.refresh().await;
            }
            let mut messages = pubsub.into_messages();
            while let Some(message) = messages.next().await {
                let Some(this) = sentinels.upgrade() else {
                    return;
                };
                // `<name> <old ip> <old port> <new ip> <new port>`
                let payload: String = message.get_payload().unwrap_or_default();
                let words: Vec<&str> = payload.split(' ').collect();
                if let [name, _, _, host, port] = words.as_slice() {
                    if *name == master {
                        if let Ok(port) = port.parse() {
                            this.switched((*host).to_owned(), port);
                        }
                    }
                }
            }
        }
        missed = true;
        tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
    }
}

/// Why a sentinel gave no primary, or a node named was not taken.
struct Refusal {
    why: String,
    /// It refused the login (wrong user or password).
    login: bool,
    /// The sentinel monitors no master of the name asked for.
    unknown_master: bool,
}

impl Refusal {
    fn login(why: String) -> Refusal {
        Refusal {
            why,
            login: true,
            unknown_master: false,
        }
    }

    fn other(why: String) -> Refusal {
        Refusal {
            why,
            login: false,
            unknown_master: false,
        }
    }

    fn unknown_master(why: String) -> Refusal {
        Refusal {
            why,
            login: false,
            unknown_master: true,
        }
    }
}

/// The lock calls' connection to the primary the sentinels name: opened on
/// first use, and again when the primary changes (a new epoch) or after it
/// failed. Cheap to share; one multiplexed connection.
pub(crate) struct SentinelLink {
    sentinels: Arc<Sentinels>,
    open: ArcSwapOption<Open>,
    opening: tokio::sync::Mutex<()>,
}

/// An open connection, and the epoch of the primary it goes to.
struct Open {
    epoch: u64,
    connection: Wire,
}

impl SentinelLink {
    pub(crate) fn new(sentinels: Arc<Sentinels>) -> SentinelLink {
        SentinelLink {
            sentinels,
            open: ArcSwapOption::empty(),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.sentinels.db()
    }

    /// The epoch of the primary calls go to now.
    pub(crate) fn epoch(&self) -> u64 {
        self.sentinels.epoch()
    }

    /// The open connection of the current epoch, opened if need be.
    async fn connection(&self) -> RedisResult<Arc<Open>> {
        let current = |open: &Option<Arc<Open>>| {
            open.as_ref()
                .filter(|open| open.epoch == self.sentinels.epoch())
                .cloned()
        };
        if let Some(open) = current(&self.open.load_full()) {
            return Ok(open);
        }
        let _opening = self.opening.lock().await;
        if let Some(open) = current(&self.open.load_full()) {
            return Ok(open);
        }
        let (epoch, client) = self.sentinels.primary().await?;
        let connection = self
            .sentinels
            .transport()
            .connect(&client)
            .await
            .inspect_err(|_| self.sentinels.suspect(epoch))?;
        let open = Arc::new(Open { epoch, connection });
        self.open.store(Some(Arc::clone(&open)));
        Ok(open)
    }

    /// After `error` on `open`: a connection that failed, or a primary that
    /// was demoted, is given up and the primary put in doubt.
    fn note(&self, open: &Arc<Open>, error: &RedisError) {
        if lost_primary(error) {
            self.open.compare_and_swap(open, None::<Arc<Open>>);
            self.sentinels.suspect(open.epoch);
        }
    }

    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let open = self.connection().await?;
        let mut connection = open.connection.clone();
        let reply = connection.req_packed_command(cmd).await;
        match &reply {
            Err(error) => self.note(&open, error),
            Ok(Value::ServerError(error)) => self.note(&open, &RedisError::from(error.clone())),
            Ok(_) => {}
        }
        reply
    }

    pub(crate) async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let open = self.connection().await?;
        let mut connection = open.connection.clone();
        let values = connection
            .req_packed_commands(pipeline, offset, count)
            .await;
        match &values {
            Err(error) => self.note(&open, error),
            Ok(values) => {
                for value in values {
                    if let Value::ServerError(error) = value {
                        self.note(&open, &RedisError::from(error.clone()));
                    }
                }
            }
        }
        values
    }
}

/// Whether `error` says the connection's node is no longer the primary,
/// or cannot be reached: its connection is given up.
fn lost_primary(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}
