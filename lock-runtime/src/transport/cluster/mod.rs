//! The Redis Cluster connection of the lock calls: one multiplexed
//! connection per primary, opened again after it broke (`transport/node`),
//! and the slot
//! map (`CLUSTER SLOTS`) to route each call to the primary of its keys'
//! slot.
//!
//! Why not the `redis` crate's cluster connection: every call there goes
//! through a routing task and then the node's connection task, one more
//! task hop each way, which cost 1.35-1.7x the client CPU per lock + unlock
//! pair of one server (docs/benchmarks.md). Here a call goes straight to the
//! node's connection, as on one server. What the cluster connection would
//! do besides is small and done here: redirections (`MOVED`: the map is
//! fetched again and `Connection::call` retries; `ASK`: the call is sent
//! once more to the named node after `ASKING`) and dropped nodes (the map
//! is fetched again from any node that answers).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError, RedisResult, Value};

pub(crate) mod slot_map;
pub(crate) mod slots;

use self::slot_map::{parse_cluster_slots, Ranges};
use self::slots::slot;
use crate::transport::node::NodeLink;
use crate::transport::switches::Switches;
use crate::transport::within;
use crate::transport::Transport;

/// The slot map, and for each slot the connection to its primary (no
/// lock, no hashing on a call's way).
struct Table {
    ranges: Arc<Ranges>,
    /// Index in `primaries` of each slot's primary; `NONE` if unserved.
    slot_primary: Vec<u16>,
    primaries: Vec<NodeLink>,
}

const NONE: u16 = u16::MAX;

pub(crate) struct Router {
    /// The seed nodes (their settings: credentials, TLS, database).
    seeds: Vec<ConnectionInfo>,
    /// How the nodes' connections are opened.
    transport: Transport,
    /// The longest a node may take to answer `CLUSTER SLOTS`.
    deadline: Duration,
    /// Which primary serves which slot, and its connection, if known.
    table: ArcSwapOption<Table>,
    /// One connection per node address (`host:port`), opened on first use.
    /// Ordered: the connections of nodes gone are dropped (closed) in its
    /// order, the same in every run of a simulation.
    nodes: Mutex<BTreeMap<String, NodeLink>>,
    /// One fetch of the map at a time.
    fetching: tokio::sync::Mutex<()>,
    /// A digest of the last map fetched (0: none yet): what a call was
    /// routed by, read with one atomic load on its way (see
    /// [`map_changed`](Router::map_changed)).
    map_digest: AtomicU64,
    /// Where the maps it fetches are told, to find the primaries that
    /// failed over (the lock calls' routers; not the notifier's).
    switches: Option<Arc<Switches>>,
}

impl Router {
    pub(crate) fn new(
        seeds: Vec<ConnectionInfo>,
        transport: Transport,
        deadline: Duration,
        switches: Option<Arc<Switches>>,
    ) -> Router {
        Router {
            seeds,
            transport,
            deadline,
            table: ArcSwapOption::empty(),
            nodes: Mutex::new(BTreeMap::new()),
            fetching: tokio::sync::Mutex::new(()),
            map_digest: AtomicU64::new(0),
            switches,
        }
    }

    /// The slot map is stale (a redirection, a node gone): fetched again
    /// before the next call.
    pub(crate) fn forget(&self) {
        self.table.store(None);
    }

    /// A digest of the slot map calls are routed by now (0: none fetched
    /// yet).
    pub(crate) fn routing_by(&self) -> u64 {
        self.map_digest.load(Ordering::Acquire)
    }

    /// Whether the slot map, fetched again now, differs from the one of
    /// digest `routed_by` (a call's [`routing_by`](Router::routing_by)).
    pub(crate) async fn map_changed(&self, routed_by: u64) -> bool {
        self.forget();
        match self.ranges().await {
            Ok(fresh) => digest(&fresh) != routed_by,
            Err(_) => false,
        }
    }

    /// The slot map, fetched if not known.
    pub(crate) async fn ranges(&self) -> RedisResult<Arc<Ranges>> {
        Ok(Arc::clone(&self.table().await?.ranges))
    }

    /// The slot table, fetched (`CLUSTER SLOTS`, from the known nodes then
    /// the seeds, the first that answers) if not known.
    async fn table(&self) -> RedisResult<Arc<Table>> {
        if let Some(table) = self.table.load_full() {
            return Ok(table);
        }
        let _fetching = self.fetching.lock().await;
        if let Some(table) = self.table.load_full() {
            return Ok(table); // another call fetched it meanwhile
        }
        let mut candidates: Vec<String> = self.nodes().keys().cloned().collect();
        candidates.extend(self.seeds.iter().filter_map(|seed| address(seed.addr())));
        candidates.sort();
        candidates.dedup();
        // Every candidate asked at once, the first good answer taken: a
        // stalled node is passed over, not waited for.
        let asks = candidates.into_iter().map(|candidate| {
            Box::pin(async move {
                let mut connection = self.node(&candidate)?;
                let reply = within(
                    self.deadline,
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut connection),
                )
                .await?;
                let host = candidate.rsplit_once(':').map_or("", |(host, _)| host);
                match parse_cluster_slots(&reply, host) {
                    Some(ranges) if !ranges.is_empty() => Ok(ranges),
                    _ => Err(RedisError::from((
                        redis::ErrorKind::Client,
                        "unexpected reply to CLUSTER SLOTS",
                        candidate,
                    ))),
                }
            })
        });
        let asks: Vec<_> = asks.collect();
        if asks.is_empty() {
            return Err((
                redis::ErrorKind::Client,
                "no Redis Cluster node to ask for the slot map",
            )
                .into());
        }
        let (ranges, _) = futures_util::future::select_ok(asks).await?;
        // Connections of nodes that serve no slot any more end.
        self.nodes()
            .retain(|node, _| ranges.iter().any(|(_, _, primary)| primary == node));
        self.map_digest.store(digest(&ranges), Ordering::Release);
        let table = Arc::new(self.build(ranges)?);
        // The switch counted before any call is routed by the new map: an
        // acquisition routed by it to a promoted replica is held back
        // (`RedisBackend::acquire`).
        if let Some(switches) = &self.switches {
            switches.map_seen(&table.ranges);
        }
        self.table.store(Some(Arc::clone(&table)));
        Ok(table)
    }

    /// The table of `ranges`: each slot's primary's connection.
    fn build(&self, ranges: Ranges) -> RedisResult<Table> {
        let mut slot_primary = vec![NONE; 16384];
        let mut primaries: Vec<NodeLink> = Vec::new();
        let mut index: HashMap<&str, u16> = HashMap::new();
        for (start, end, address) in &ranges {
            let at = match index.get(address.as_str()) {
                Some(&at) => at,
                None => {
                    primaries.push(self.node(address)?);
                    let at = (primaries.len() - 1) as u16;
                    index.insert(address, at);
                    at
                }
            };
            for slot in *start..=(*end).min(16383) {
                slot_primary[usize::from(slot)] = at;
            }
        }
        Ok(Table {
            ranges: Arc::new(ranges),
            slot_primary,
            primaries,
        })
    }

    fn nodes(&self) -> MutexGuard<'_, BTreeMap<String, NodeLink>> {
        self.nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The connection to the node at `address` (`host:port`), with the
    /// first seed's settings: credentials, database, TLS and its
    /// certificates (a discovered node is trusted as the seed is).
    fn node(&self, address: &str) -> RedisResult<NodeLink> {
        if let Some(connection) = self.nodes().get(address) {
            return Ok(connection.clone());
        }
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
            .ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::Client,
                    "bad node address",
                    address.to_owned(),
                ))
            })?;
        let seed = &self.seeds[0];
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let client = redis::Client::open(seed.clone().set_addr(addr))?;
        let connection = NodeLink::new(client, self.transport.clone());
        Ok(self
            .nodes()
            .entry(address.to_owned())
            .or_insert(connection)
            .clone())
    }

    /// The connection to the primary of `slot` (`None`: any primary).
    async fn primary(&self, slot: Option<u16>) -> RedisResult<NodeLink> {
        let table = self.table().await?;
        let at = slot.map_or(0, |slot| table.slot_primary[usize::from(slot) % 16384]);
        match table.primaries.get(usize::from(at)) {
            Some(connection) => Ok(connection.clone()),
            None => {
                self.forget();
                Err(RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                    "no primary serves the slot",
                    slot.unwrap_or_default().to_string(),
                )))
            }
        }
    }

    /// Sends `cmd` to the primary of its key's slot.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let unfinished = Unfinished::new(self);
        let reply = self.send_once(cmd).await;
        unfinished.done();
        reply
    }

    async fn send_once(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut connection = self.primary(key_slot(cmd)).await?;
        let reply = connection.req_packed_command(cmd).await;
        let reply = reply.and_then(Value::extract_error);
        match reply {
            Err(error) if asked(&error).is_some() => {
                // A slot being migrated, the key already moved: once to the
                // importing node, announced by ASKING.
                let (address, _) = asked(&error).unwrap_or_default();
                let mut pipeline = redis::pipe();
                pipeline.cmd("ASKING").add_command(cmd.clone());
                let mut values = self
                    .node(&address)?
                    .req_packed_commands(&pipeline, 0, 2)
                    .await?;
                let reply = values.pop().unwrap_or(Value::Nil).extract_error();
                self.note(reply.as_ref().err());
                reply
            }
            reply => {
                self.note(reply.as_ref().err());
                reply
            }
        }
    }

    /// Sends `pipeline` to the primary of `slot`, or of its first keyed
    /// command's slot (its commands may be of any slot that primary
    /// serves). Replies as values; redirections in them make the map stale.
    pub(crate) async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
        slot: Option<u16>,
    ) -> RedisResult<Vec<Value>> {
        let unfinished = Unfinished::new(self);
        let values = self.send_pipeline_once(pipeline, offset, count, slot).await;
        unfinished.done();
        values
    }

    async fn send_pipeline_once(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
        slot: Option<u16>,
    ) -> RedisResult<Vec<Value>> {
        let slot = slot.or_else(|| pipeline.cmd_iter().find_map(key_slot));
        let mut connection = self.primary(slot).await?;
        let mut values = connection
            .req_packed_commands(pipeline, offset, count)
            .await;
        let ask = values.as_ref().ok().and_then(|values| {
            values.iter().find_map(|value| match value {
                Value::ServerError(error) => asked(&RedisError::from(error.clone())),
                _ => None,
            })
        });
        if let Some((address, _)) = ask {
            // A slot being migrated, a key already moved: the pipeline once
            // more, to the importing node, each command announced by
            // ASKING (its replies dropped).
            let mut asking = redis::pipe();
            for cmd in pipeline.cmd_iter() {
                asking.cmd("ASKING").add_command(cmd.clone());
            }
            values = self
                .node(&address)?
                .req_packed_commands(&asking, 2 * offset, 2 * count)
                .await
                .map(|values| values.into_iter().skip(1).step_by(2).collect());
        }
        match &values {
            Ok(values) => values.iter().for_each(|value| {
                if let Value::ServerError(error) = value {
                    self.note(Some(&RedisError::from(error.clone())));
                }
            }),
            Err(error) => self.note(Some(error)),
        }
        values
    }

    /// After an error: a redirection, a node that cannot be reached or a
    /// cluster in transition make the map stale.
    fn note(&self, error: Option<&RedisError>) {
        let Some(error) = error else {
            return;
        };
        let stale = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || matches!(
                error.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::Moved
                        | redis::ServerErrorKind::ClusterDown
                        | redis::ServerErrorKind::TryAgain
                        | redis::ServerErrorKind::MasterDown
                )
            );
        if stale {
            self.forget();
        }
    }
}

/// A call dropped before its node answered (the call's deadline ran out
/// first, or the caller gave up) makes the slot map stale, as a timeout
/// would: the node may be stalled, and its slots may move to a replica
/// meanwhile (the next call then fetches the map instead of going to the
/// stalled node again).
struct Unfinished<'a> {
    router: Option<&'a Router>,
}

impl<'a> Unfinished<'a> {
    fn new(router: &'a Router) -> Self {
        Unfinished {
            router: Some(router),
        }
    }

    fn done(mut self) {
        self.router = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(router) = self.router {
            router.forget();
        }
    }
}

/// A digest of a slot map (never 0).
fn digest(ranges: &Ranges) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ranges.hash(&mut hasher);
    hasher.finish().max(1)
}

/// `host:port` of a connection address.
fn address(addr: &ConnectionAddr) -> Option<String> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some(format!("{host}:{port}"))
        }
        _ => None,
    }
}

/// The node an `ASK` redirection names.
fn asked(error: &RedisError) -> Option<(String, u16)> {
    (error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask))
        .then(|| error.redirect_node())
        .flatten()
        .map(|(address, slot)| (address.to_owned(), slot))
}

/// The slot of the first key of a command this crate sends: `EVAL` and
/// `EVALSHA` name theirs after the script and the key count, the others
/// (`SET`, `GET`, ...) first; `CLUSTER`, `WAIT` and the like have none.
fn key_slot(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let is = |names: &[&[u8]]| names.iter().any(|known| name.eq_ignore_ascii_case(known));
    let key = if is(&[
        b"EVALSHA",
        b"EVAL",
        b"EVALSHA_RO",
        b"EVAL_RO",
        b"FCALL",
        b"FCALL_RO",
    ]) {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        args.next()?
    } else if is(&[b"CLUSTER", b"WAIT", b"PING", b"ASKING", b"SCRIPT", b"INFO"]) {
        return None;
    } else {
        args.next()?
    };
    Some(slot(std::str::from_utf8(key).ok()?))
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn finds_the_key_of_each_command() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc")
            .arg(2)
            .arg("lock:{a}")
            .arg("lock:{a}:fence")
            .arg("token");
        assert_eq!(key_slot(&eval), Some(super::slot("a")));
        let mut set = redis::cmd("SET");
        set.arg("lock:{b}").arg("token").arg("NX");
        assert_eq!(key_slot(&set), Some(super::slot("b")));
        let mut none = redis::cmd("EVAL");
        none.arg("return 1").arg(0);
        assert_eq!(key_slot(&none), None);
        assert_eq!(key_slot(redis::cmd("CLUSTER").arg("SLOTS")), None);
        assert_eq!(key_slot(redis::cmd("WAIT").arg(1).arg(100)), None);
    }
}
