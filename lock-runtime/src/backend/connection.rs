//! The lock's Redis connection, and the one place that runs Redis calls.
//!
//! One multiplexed connection per client, opened again after it broke
//! (`transport/node`; on a cluster one per primary, `transport/cluster`).
//! Two faults
//! it does not handle alone are handled here:
//!
//! - A connection closed while idle (Redis `timeout`, a proxy's or load
//!   balancer's idle timeout, `CLIENT KILL`, a failover) fails the next call
//!   with "broken pipe" although Redis is healthy. Every call this crate
//!   makes is safe to repeat (releases and renewals compare by token, an
//!   acquire retried with its token recognises a lock it already took), so a
//!   call that fails on the connection is retried, on the connection
//!   opened again, for as long as its deadline lasts.
//! - A connection that stalls without closing would keep every later call
//!   waiting behind the first: after a call times out, the connection is
//!   replaced by a new one, and the stalled one is dropped.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::scripts::ScriptsSent;
use crate::error::retryable;
use crate::transport::cluster::slot_map::Ranges;
use crate::transport::cluster::Router;
use crate::transport::node::{ConditionalDelete, NodeLink};
use crate::transport::sentinel::{SentinelLink, Sentinels};
use crate::transport::switches::Switches;
use crate::transport::{timed_out, Transport};

/// Where the calls go: one server (or a primary with replicas behind one
/// address), a Redis Cluster named by its seed nodes, or the primary that
/// Redis Sentinel names.
#[derive(Clone)]
pub(crate) enum Target {
    Node(Box<redis::Client>, Transport),
    /// The seed nodes, how connections are opened, the longest a node
    /// may take to answer `CLUSTER SLOTS`, and where the slot maps fetched
    /// are told (to find primaries that failed over).
    Cluster(
        Vec<redis::ConnectionInfo>,
        Transport,
        Duration,
        Arc<Switches>,
    ),
    /// The primary of a master name, as the sentinels name it
    /// (`transport/sentinel`): each link a connection of its own to it.
    Sentinel(Arc<Sentinels>),
}

impl Target {
    /// Where it leads, for messages: its URL with the password masked, a
    /// cluster's seeds, the sentinels and their master name.
    pub(crate) fn describe(&self) -> String {
        let url = |info: &redis::ConnectionInfo| {
            crate::redact::redact_url(&crate::url::connection_url(info))
        };
        match self {
            Target::Node(redis, _) => url(redis.get_connection_info()),
            Target::Cluster(seeds, ..) => {
                let seeds: Vec<String> = seeds.iter().map(url).collect();
                format!("cluster [{}]", seeds.join(", "))
            }
            Target::Sentinel(sentinels) => sentinels.describe(),
        }
    }

    /// A new connection (opened on first use).
    pub(crate) fn open(&self) -> Link {
        match self {
            Target::Node(redis, transport) => Link::Node(NodeLink::asking_offers(
                (**redis).clone(),
                transport.clone(),
            )),
            Target::Cluster(seeds, transport, deadline, switches) => {
                Link::Cluster(Arc::new(Router::new(
                    seeds.clone(),
                    transport.clone(),
                    *deadline,
                    Some(Arc::clone(switches)),
                )))
            }
            Target::Sentinel(sentinels) => {
                Link::Sentinel(Arc::new(SentinelLink::new(Arc::clone(sentinels))))
            }
        }
    }

    /// The switches of primary its connections learn of (`None` on one
    /// server: there is no other primary).
    pub(crate) fn switches(&self) -> Option<Arc<Switches>> {
        match self {
            Target::Node(..) => None,
            Target::Cluster(.., switches) => Some(Arc::clone(switches)),
            Target::Sentinel(sentinels) => Some(sentinels.switches()),
        }
    }

    /// A connection of this target stopped answering (a call timed out):
    /// with Sentinel, the primary it talks to is checked before the next
    /// connection opens.
    fn stalled(&self) {
        if let Target::Sentinel(sentinels) = self {
            sentinels.suspect_current();
        }
    }
}

/// A connection a call is made on: cheap to clone (a handle to one
/// server's connection, to a cluster's router, or to Sentinel's primary).
#[derive(Clone)]
pub(crate) enum Link {
    Node(NodeLink),
    /// A connection per primary, and the slot map (`transport/cluster`).
    Cluster(Arc<Router>),
    /// A connection to the primary Redis Sentinel names, opened again when
    /// it changes (`transport/sentinel`).
    Sentinel(Arc<SentinelLink>),
    /// Acknowledged mode: each command or pipeline sent on the inner link
    /// is followed by `WAIT` in the same round trip (so on the connection
    /// that carried the write), and fails with [`not_replicated`] if fewer
    /// replicas than asked confirm in time.
    Acked(Box<Link>, Ack),
}

/// Acknowledged mode: replicas that must confirm a write, and how long
/// `WAIT` gives them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ack {
    pub(crate) replicas: u32,
    pub(crate) timeout_ms: u64,
}

/// The error code of a write fewer replicas confirmed than asked.
const NOT_REPLICATED: &str = "NOTREPLICATED";

/// The error of a write that only `confirmed` replicas confirmed.
fn not_replicated(confirmed: i64) -> RedisError {
    redis::make_extension_error(NOT_REPLICATED.to_owned(), Some(confirmed.to_string()))
}

/// How many replicas confirmed, if `error` says a write was not confirmed.
pub(crate) fn replicas_confirmed(error: &RedisError) -> Option<u32> {
    (error.code() == Some(NOT_REPLICATED)).then(|| {
        error
            .detail()
            .and_then(|detail| detail.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Checks a `WAIT` reply against `ack`.
fn check_ack(reply: Option<Value>, ack: Ack) -> RedisResult<()> {
    let confirmed = match reply {
        Some(Value::Int(confirmed)) => confirmed,
        Some(other) => return other.extract_error().and(Ok(())),
        None => 0,
    };
    if confirmed < i64::from(ack.replicas) {
        return Err(not_replicated(confirmed));
    }
    Ok(())
}

/// `pipeline`, then `WAIT`.
fn with_wait(pipeline: &Pipeline, ack: Ack) -> Pipeline {
    let mut acked = pipeline.clone();
    acked.cmd("WAIT").arg(ack.replicas).arg(ack.timeout_ms);
    acked
}

impl Link {
    /// The plain conditional delete the server offers, on one server whose
    /// connection is open (a cluster's nodes, Sentinel's primary and
    /// acknowledged mode's connections are not asked: the script).
    pub(crate) fn conditional_delete(&self) -> ConditionalDelete {
        match self {
            Link::Node(node) => node
                .offers()
                .map_or(ConditionalDelete::None, |offers| offers.conditional_delete),
            _ => ConditionalDelete::None,
        }
    }

    /// On a cluster, the slot map (fetched if not known).
    pub(crate) async fn slot_map(&self) -> Option<Arc<Ranges>> {
        match self {
            Link::Cluster(router) => router.ranges().await.ok(),
            Link::Acked(inner, _) => Box::pin(inner.slot_map()).await,
            Link::Node(_) | Link::Sentinel(_) => None,
        }
    }

    /// Where this link's calls go now, on a deployment where that can
    /// change under a call: a cluster's slot map (its digest), Sentinel's
    /// primary (its epoch). `None` on one server.
    fn route(&self) -> Option<Route> {
        match self {
            Link::Cluster(router) => Some(Route::Slots(router.routing_by())),
            Link::Sentinel(link) => Some(Route::Primary(link.epoch())),
            Link::Acked(inner, _) => inner.route(),
            Link::Node(_) => None,
        }
    }

    /// Whether calls now go elsewhere than by `route`: on a cluster, the
    /// slot map is fetched again and compared; with Sentinel, the primary
    /// changed (a sentinel's `+switch-master`).
    async fn moved_from(&self, route: Route) -> bool {
        match (self, route) {
            (Link::Cluster(router), Route::Slots(routed_by)) => router.map_changed(routed_by).await,
            (Link::Sentinel(link), Route::Primary(epoch)) => link.epoch() != epoch,
            (Link::Acked(inner, _), route) => Box::pin(inner.moved_from(route)).await,
            _ => false,
        }
    }

    /// On a cluster, the slot map proved stale: fetched again when next
    /// needed.
    pub(crate) fn forget_slot_map(&self) {
        match self {
            Link::Cluster(router) => router.forget(),
            Link::Acked(inner, _) => inner.forget_slot_map(),
            Link::Node(_) | Link::Sentinel(_) => {}
        }
    }

    /// Sends `pipeline` in one round trip: to the server, or on a cluster
    /// to the primary of `slot` (its commands may be of any slot that
    /// primary serves; one it does not is answered MOVED). Replies as
    /// values, the first error reply as the error.
    pub(crate) async fn pipeline_to(
        &mut self,
        pipeline: &Pipeline,
        slot: Option<u16>,
    ) -> RedisResult<Vec<Value>> {
        match (self, slot) {
            (Link::Acked(inner, ack), slot) => {
                let ack = *ack;
                let mut values =
                    Box::pin(inner.pipeline_to(&with_wait(pipeline, ack), slot)).await?;
                check_ack(values.pop(), ack)?;
                Ok(values)
            }
            (Link::Cluster(router), slot) => {
                let values = router
                    .send_pipeline(pipeline, 0, pipeline.len(), slot)
                    .await?;
                values.into_iter().map(Value::extract_error).collect()
            }
            (link, _) => pipeline.query_async(link).await,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Node(node) => Box::pin(node.send(cmd)),
            Link::Cluster(router) => Box::pin(async move { router.send(cmd).await }),
            Link::Sentinel(link) => Box::pin(async move { link.send(cmd).await }),
            Link::Acked(inner, ack) => Box::pin(async move {
                let ack = *ack;
                let mut pipeline = redis::pipe();
                pipeline.add_command(cmd.clone());
                let pipeline = with_wait(&pipeline, ack);
                let mut values = inner.req_packed_commands(&pipeline, 0, 2).await?;
                let wait = values.pop();
                // The write's own error first (NOSCRIPT: sent again as EVAL).
                let reply = values.pop().unwrap_or(Value::Nil).extract_error()?;
                check_ack(wait, ack)?;
                Ok(reply)
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Node(node) => Box::pin(node.send_pipeline(pipeline, offset, count)),
            Link::Cluster(router) => {
                Box::pin(async move { router.send_pipeline(pipeline, offset, count, None).await })
            }
            Link::Sentinel(link) => {
                Box::pin(async move { link.send_pipeline(pipeline, offset, count).await })
            }
            Link::Acked(inner, ack) => Box::pin(async move {
                let ack = *ack;
                let acked = with_wait(pipeline, ack);
                let mut values = inner.req_packed_commands(&acked, offset, count + 1).await?;
                check_ack(values.pop(), ack)?;
                Ok(values)
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Node(node) => node.get_db(),
            Link::Cluster(_) => 0,
            Link::Sentinel(link) => link.db(),
            Link::Acked(inner, _) => inner.get_db(),
        }
    }
}

/// The first pause before a retry; doubled up to [`MAX_RETRY_PAUSE`].
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(5);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);

pub(crate) struct Connection {
    target: Target,
    current: ArcSwap<Current>,
    generation: AtomicU64,
    /// The longest one call may take, its retries included.
    deadline: Duration,
    /// The scripts this client had Redis run (sent as EVAL the first time).
    scripts: ScriptsSent,
    /// A refused connection fails the call on its second refusal instead of
    /// being retried within its deadline: a quorum's node, where the attempt
    /// counts the node as failed and goes on with the others.
    refusal_is_final: bool,
}

/// One connection manager; replaced as a whole when a call times out.
pub(crate) struct Current {
    generation: u64,
    manager: Link,
}

impl Connection {
    pub(crate) fn new(target: Target, deadline: Duration) -> Connection {
        let manager = target.open();
        Connection {
            target,
            current: ArcSwap::from_pointee(Current {
                generation: 0,
                manager,
            }),
            generation: AtomicU64::new(0),
            deadline,
            scripts: ScriptsSent::default(),
            refusal_is_final: false,
        }
    }

    /// A refused connection fails a call at once (see `refusal_is_final`).
    pub(crate) fn refusal_is_final(mut self) -> Connection {
        self.refusal_is_final = true;
        self
    }

    /// The connection calls are made on now.
    pub(crate) fn link(&self) -> Link {
        self.current.load().manager.clone()
    }

    pub(crate) fn scripts(&self) -> &ScriptsSent {
        &self.scripts
    }

    /// The longest one call may take, its retries included.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Replaces the connection `stale` (one that let a call time out) with a
    /// new one, unless another call replaced it already.
    fn replace(&self, stale: u64) {
        self.target.stalled();
        let manager = self.target.open();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let fresh = Arc::new(Current {
            generation,
            manager,
        });
        self.current.rcu(|current| {
            if current.generation == stale {
                Arc::clone(&fresh)
            } else {
                Arc::clone(current)
            }
        });
        tracing::debug!("Redis call timed out; the lock connection was replaced");
    }

    /// Runs `attempt` (given a connection and the attempt's number, from 0)
    /// until it succeeds, fails with an error that retrying cannot help, or
    /// the call's deadline passes. Only for calls that are safe to repeat:
    /// an attempt that failed may still have run in Redis.
    pub(crate) async fn call<T, F, Fut>(&self, attempt: F) -> RedisResult<T>
    where
        F: FnMut(Link, u32) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.call_until(None, attempt).await
    }

    /// [`call`](Self::call), ending by `until` if that comes before the
    /// call's own deadline (a call of an acquisition that made others
    /// before it, or waited: the acquisition ends within one deadline).
    pub(crate) async fn call_until<T, F, Fut>(
        &self,
        until: Option<tokio::time::Instant>,
        mut attempt: F,
    ) -> RedisResult<T>
    where
        F: FnMut(Link, u32) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        // One clock reading per call on its common path: the deadline's
        // (each reading is tens of nanoseconds, and a pair makes two calls).
        let mut now = tokio::time::Instant::now();
        let deadline = match until {
            Some(until) => until.min(now + self.deadline),
            None => now + self.deadline,
        };
        let mut pause = FIRST_RETRY_PAUSE;
        let mut number = 0;
        loop {
            // The link is cloned out of a guard held this briefly: held
            // across the call, with many calls in flight `arc_swap` would
            // run out of its per-thread slots and take its slow path.
            let (link, generation) = {
                let current = self.current.load();
                (current.manager.clone(), current.generation)
            };
            // On a cluster or through Sentinel, a call still unanswered at
            // half its deadline checks where calls go now: its node may be
            // stalled, and a replica promoted meanwhile. Calls routed before
            // the new map or primary showed (a map fetched by another call
            // while a failover was under way) would otherwise each wait on
            // the stalled node until their deadline.
            let route = link.route().map(|route| (route, link.clone()));
            let first_wait = match route {
                Some(_) => now + deadline.saturating_duration_since(now) / 2,
                None => deadline,
            };
            let mut call = std::pin::pin!(attempt(link, number));
            let waited = match tokio::time::timeout_at(first_wait, call.as_mut()).await {
                Ok(reply) => Waited::Reply(reply),
                Err(_elapsed) => match route {
                    Some((route, link)) => Box::pin(after_half(&link, route, call, deadline)).await,
                    None => Waited::TimedOut,
                },
            };
            let error = match waited {
                Waited::Reply(Ok(value)) => return Ok(value),
                // A script's command refused by the ACL: named.
                Waited::Reply(Err(error)) => super::script_errors::explain(error),
                // Sent again at once, by the new map or to the new primary
                // (any attempt may be repeated; the one left behind went to
                // a node that no longer serves its key).
                Waited::Moved => {
                    number += 1;
                    now = tokio::time::Instant::now();
                    continue;
                }
                Waited::TimedOut => {
                    self.replace(generation);
                    return Err(timed_out(self.deadline));
                }
            };
            // A refusal may be the answer to a reconnect made while the
            // server was down: one more try after a fresh reconnect.
            // A retry is sent only if at least a pause is left for it after
            // the pause before it: one started at the deadline's edge would
            // end as "no answer", hiding the error that made it retry (a
            // refused connection reported as a timeout).
            if !retryable(&error)
                || (self.refusal_is_final && error.is_connection_refusal() && number > 0)
                || tokio::time::Instant::now() + pause * 2 >= deadline
            {
                return Err(error);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
            number += 1;
            now = tokio::time::Instant::now();
        }
    }
}

/// Where a call was sent (see [`Link::route`]).
enum Route {
    Slots(u64),
    Primary(u64),
}

/// How waiting for an attempt ended.
enum Waited<T> {
    Reply(RedisResult<T>),
    /// Unanswered at half the deadline, and calls now go elsewhere than
    /// the attempt was sent.
    Moved,
    /// No answer within the deadline.
    TimedOut,
}

/// A call on a cluster or through Sentinel unanswered at half its
/// deadline: if calls now go elsewhere than by `route` (the slot map,
/// fetched again, changed: every node is asked at once, a stalled one
/// passed over; or Sentinel switched the primary), the call is to be sent
/// again; else the attempt is waited for until the deadline.
async fn after_half<T, Fut>(
    link: &Link,
    route: Route,
    mut call: std::pin::Pin<&mut Fut>,
    deadline: tokio::time::Instant,
) -> Waited<T>
where
    Fut: Future<Output = RedisResult<T>>,
{
    match tokio::time::timeout_at(deadline, link.moved_from(route)).await {
        Err(_elapsed) => return Waited::TimedOut,
        // Answered meanwhile after all: that answer stands.
        Ok(true) => {
            return match futures_util::FutureExt::now_or_never(call.as_mut()) {
                Some(reply) => Waited::Reply(reply),
                None => Waited::Moved,
            }
        }
        Ok(false) => {}
    }
    match tokio::time::timeout_at(deadline, call).await {
        Ok(reply) => Waited::Reply(reply),
        Err(_elapsed) => Waited::TimedOut,
    }
}
