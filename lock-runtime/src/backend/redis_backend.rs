//! [`RedisBackend`]: the lock on one Redis server (or a primary with replicas
//! behind one address), or on a Redis Cluster. Every lock's keys live in one
//! slot. The exclusive lock is here, the shared-holder kinds in `shared.rs`,
//! renewals in `renewal.rs`.

mod inspect;
mod peek;
mod quorum_node;
mod record;
mod renewal;
mod replicas;
mod shared;

pub(crate) use quorum_node::{Ballot, Vote, VoteKind};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, Either};
use redis::aio::ConnectionLike;
use redis::{Cmd, Value};
use tokio::time::Instant;

use super::ack_pool::{nudged, on_borrowed, AckPool, Borrowed};
use super::connection::{replicas_confirmed, Ack, Connection, Link, Target};
use super::scripts::{
    evalsha, run, LuaScript, Told, ACQUIRE, ACQUIRE_ALL, HANDOFF, LEAVE, RELEASE, RELEASE_KEEPING,
};
use super::{
    Acquire, AcquireAll, AcquireAllRequest, AcquireRequest, Backend, Found, Kind, Pass, Peeked,
    RecordWrite, Release, RenewItem, Snapshot, Switches,
};
use crate::error::LockError;
use crate::keys::LockKeys;
use crate::transport::cluster::slots;
use crate::transport::node::ConditionalDelete;

pub(crate) struct RedisBackend {
    connection: Connection,
    /// Acknowledged mode (see `Config::acknowledged`), and the connections
    /// its calls borrow.
    ack: Option<Ack>,
    ack_pool: Option<Arc<AckPool>>,
    /// On a Redis Cluster: renewals are grouped by slot and node, a plain
    /// acquire is `SET NX GET` (a retry recognises its own token).
    cluster: bool,
    /// The ACL refused a message to waiters: said once (see [`told`]).
    publish_refused: AtomicBool,
    /// Where the calls go, its password masked: named by its errors.
    server: Box<str>,
    /// The switches of primary its connections learn of (Sentinel, a
    /// cluster; see [`Backend::switches`]).
    switches: Option<Arc<Switches>>,
    /// Acknowledged mode: the primary's replicas as last seen (`replicas.rs`).
    replicas: replicas::ReplicaWatch,
    /// The server refused its plain conditional delete (an ACL without
    /// it): releases run the script.
    conditional_refused: AtomicBool,
}

impl RedisBackend {
    pub(crate) fn new(target: Target, deadline: Duration, ack: Option<Ack>) -> RedisBackend {
        let cluster = matches!(target, Target::Cluster(..));
        let server = target.describe().into_boxed_str();
        let switches = target.switches();
        let target_for_pool = target.clone();
        RedisBackend {
            server,
            connection: Connection::new(target, deadline),
            ack_pool: ack.map(|_| AckPool::new(target_for_pool)),
            ack,
            cluster,
            publish_refused: AtomicBool::new(false),
            switches,
            replicas: replicas::ReplicaWatch::new(),
            conditional_refused: AtomicBool::new(false),
        }
    }

    /// The code of a script that may wake waiters; the first time the ACL
    /// refused one of its messages, a warning naming the permission. The
    /// script did its work: the waiters it could not tell find out by their
    /// timed retries (at most 500 ms late), so this is no error.
    pub(super) fn told(&self, told: Told) -> i64 {
        if let Some(said) = told.refused {
            if !self.publish_refused.swap(true, Ordering::Relaxed) {
                let lacks = if said.contains("channel") {
                    "the channel pattern `&lock-waiters:*`"
                } else if self.cluster {
                    "the command `spublish`"
                } else {
                    "the command `publish`"
                };
                tracing::warn!(
                    error = %said,
                    "the Redis user may not publish to the waiters' channels: add {lacks} to its \
                     ACL rule; until then releases do not wake waiters of other processes, which \
                     find out by polling (at most 500 ms late)"
                );
            }
        }
        told.code
    }

    /// A node of a quorum: a refused connection fails its calls at once
    /// (the quorum goes on with the other nodes, and tries this one again
    /// with its next call).
    pub(crate) fn quorum_node(mut self) -> RedisBackend {
        self.connection = self.connection.refusal_is_final();
        self
    }

    /// Runs `attempt` under the call deadline (see [`Connection::call`]),
    /// naming the lock and the operation in the error.
    async fn call<T, F, Fut>(
        &self,
        name: &str,
        operation: &'static str,
        attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Link, u32) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.call_until(name, operation, None, attempt).await
    }

    /// [`call`](Self::call), ending by `until` if that comes first (see
    /// [`AcquireRequest::until`]).
    async fn call_until<T, F, Fut>(
        &self,
        name: &str,
        operation: &'static str,
        until: Option<Instant>,
        mut attempt: F,
    ) -> Result<T, LockError>
    where
        F: FnMut(Link, u32) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        // Acquisitions carry `WAIT` in acknowledged mode.
        let ack = self.ack.filter(|_| operation == "acquire");
        self.connection
            .call_until(until, |link, number| {
                // An acquisition's retry, just after this client learned of
                // a switch of primary (often from this call: a `MOVED`, a
                // `READONLY`, or sent again at half its deadline), is held
                // back as a first attempt is (`acquire`).
                let held = match number {
                    0 => None,
                    _ if operation != "acquire" => None,
                    _ => self.held_back(|| None),
                };
                // Without acknowledged mode (the common case) the attempt's
                // own future, unwrapped: every async layer around it would
                // hold it twice (as its argument and as what it awaits),
                // and the box `Backend::acquire` puts it in would outgrow
                // the allocator's cache of small blocks (see `acquire_once`).
                if ack.is_none() && held.is_none() {
                    return Either::Left(attempt(link, number));
                }
                let main = link.clone();
                let (link, borrowed) = self.for_call(link, ack);
                // Nudged past its `WAIT`'s timeout: on one server, on an
                // open connection of the pool (`ack_pool.rs`).
                let nudge = !self.cluster
                    && borrowed
                        .as_ref()
                        .is_some_and(|borrowed| !borrowed.is_fresh());
                let call = on_borrowed(borrowed, attempt(link, number));
                Either::Right(Box::pin(async move {
                    if let Some(until) = held {
                        tokio::time::sleep_until(until).await;
                    }
                    match ack {
                        Some(ack) if nudge => nudged(ack, main, call).await,
                        _ => call.await,
                    }
                }))
            })
            .await
            .map_err(|source| LockError::redis_at(name, operation, &self.server, source))
    }

    /// Until when an acquisition of a key of `slot` (on a cluster; `None`:
    /// any) is held back after a switch of primary that concerns it
    /// (`transport/switches.rs`, `GRACE`): the holders of locks the new
    /// primary lacks are told first. `None` in the common case (one atomic
    /// load), and always on one server.
    fn held_back(&self, slot: impl FnOnce() -> Option<u16>) -> Option<Instant> {
        self.switches.as_ref()?.held_back(slot)
    }

    /// The connection for one call: `link`, or in acknowledged mode
    /// (`ack`) one of the call's own from the pool (see `ack_pool.rs`),
    /// followed by `WAIT`.
    fn for_call(&self, link: Link, ack: Option<Ack>) -> (Link, Option<Borrowed>) {
        let Some(ack) = ack else {
            return (link, None);
        };
        let borrowed = self.ack_pool.as_ref().and_then(AckPool::borrow);
        let link = borrowed.as_ref().map_or(link, Borrowed::link);
        (Link::Acked(Box::new(link), ack), borrowed)
    }

    /// One acquire, as the request asks (see [`Backend::acquire`]).
    async fn acquire_once(&self, request: &AcquireRequest<'_>) -> Result<Acquire, LockError> {
        // Uncontended, without a queue or fencing to honour: one plain
        // `SET NX PX` (for a reader, a lone reader's `r:<token>` in the
        // writer key; for a writer, its token there, checked against the
        // readers and the queue in the same round trip).
        let plain = !(request.join
            || request.respect.any()
            || request.fence_retention_ms.is_some()
            || request.mine);
        // Every branch but the first is boxed: a future is as large as its
        // largest state, and moving it (into its parent's state, into the
        // box of `Backend::acquire`) copies all of it. Unboxed, the
        // uncontended exclusive acquire carried the scripts' futures too:
        // 4.6 KB copied several times per acquisition, a third of the
        // client CPU it spent beyond hand-written `redis` code (W2). With
        // `call`'s layers gone from the common path it is 728 bytes, and
        // its box is one the allocator serves from its per-thread cache
        // (glibc's: blocks up to 1 KB). docs/benchmarks.md, "Client CPU".
        match request.kind {
            Kind::Exclusive if plain => self.set_if_free(request).await,
            Kind::Exclusive => {
                Box::pin(self.call_until(
                    request.keys.name(),
                    "acquire",
                    request.until,
                    |mut connection, attempt| async move {
                        let retry = AcquireRequest {
                            mine: request.mine || attempt > 0,
                            ..*request
                        };
                        self.acquire_script(&mut connection, &retry).await
                    },
                ))
                .await
            }
            Kind::Read | Kind::Write if plain => {
                Box::pin(async {
                    // Up to three calls (the plain try, its give-back, the
                    // script): all within one deadline (lock-sim node seed
                    // 6052: a read's try parked in a stalled server, then a
                    // script without an answer, 809 ms against 541).
                    let until = request
                        .until
                        .unwrap_or_else(|| Instant::now() + self.connection.deadline());
                    let request = &AcquireRequest {
                        until: Some(until),
                        ..*request
                    };
                    let alone = if request.kind == Kind::Read {
                        self.lone_reader(request).await?
                    } else {
                        self.lone_writer(request).await?
                    };
                    match alone {
                        Some(acquired) => Ok(acquired),
                        // Someone holds the writer key (a writer, a lone
                        // reader, the gate of queued waiters), or shares or
                        // waiters are there. The script decides.
                        None => self.acquire_shared(request).await,
                    }
                })
                .await
            }
            _ => Box::pin(self.acquire_shared(request)).await,
        }
    }

    /// `SET key token NX PX ttl`: what an uncontended lock costs. A retry
    /// (the first attempt's outcome unknown) is the acquire script with
    /// `mine`, which recognises a lock the first attempt took.
    async fn set_if_free(&self, request: &AcquireRequest<'_>) -> Result<Acquire, LockError> {
        let keys = request.keys;
        let bytes = keys.lock.len() + request.token.len() + 32;
        let mut set = Cmd::with_capacity(6, bytes);
        set.arg("SET")
            .arg(&keys.lock)
            .arg(request.token)
            .arg("NX")
            .arg("PX")
            .arg(request.ttl_ms);
        let set = &set;
        self.call_until(
            keys.name(),
            "acquire",
            request.until,
            |mut connection, attempt| async move {
                if attempt > 0 {
                    let retry = AcquireRequest {
                        mine: true,
                        ..*request
                    };
                    // Boxed: a rare path that must not size the common one.
                    return Box::pin(self.acquire_script(&mut connection, &retry)).await;
                }
                match set.query_async(&mut connection).await? {
                    Value::Okay => Ok(Acquire::Acquired {
                        fence: None,
                        found: None,
                        holds: None,
                    }),
                    Value::SimpleString(ok) if ok == "OK" => Ok(Acquire::Acquired {
                        fence: None,
                        found: None,
                        holds: None,
                    }),
                    Value::Nil => Ok(Acquire::Busy { expires_in: None }),
                    // Not what Redis answers SET NX; an unknown outcome (the
                    // caller cleans up a lock it may hold).
                    other => Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "unexpected reply to SET NX PX",
                        format!("{other:?}"),
                    ))),
                }
            },
        )
        .await
    }

    /// One call of `acquire.lua`, decoded.
    async fn acquire_script(
        &self,
        connection: &mut Link,
        request: &AcquireRequest<'_>,
    ) -> redis::RedisResult<Acquire> {
        let keys = request.keys;
        // 0: no fencing token.
        let retention_ms = request.fence_retention_ms.unwrap_or(0);
        let bytes = 4 * keys.lock.len() + 24 + request.token.len() + 62 + request.member.len();
        let mut cmd = evalsha(&ACQUIRE, 4, 12, bytes);
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.queue())
            .arg(keys.waiters())
            .arg(request.token)
            .arg(request.ttl_ms)
            .arg(retention_ms)
            .arg(request.waiter_timeout_ms)
            .arg(u8::from(request.join))
            .arg(request.respect.arg())
            .arg(request.member)
            .arg(u8::from(request.mine));
        let reply: Vec<i64> = run(&ACQUIRE, &cmd, connection, self.connection.scripts()).await?;
        // `{1, fence}` acquired; `{1, fence, pttl}` found already taken with
        // this token; `{0, pttl}` busy.
        let at = |i: usize| reply.get(i).copied().unwrap_or(-1);
        let millis = |value: i64| u64::try_from(value).ok().map(Duration::from_millis);
        Ok(if at(0) == 1 {
            Acquire::Acquired {
                fence: request.fence_retention_ms.map(|_| at(1) as u64),
                found: (reply.len() > 2).then(|| millis(at(2)).unwrap_or(Duration::ZERO)),
                holds: None,
            }
        } else {
            Acquire::Busy {
                expires_in: millis(at(1)),
            }
        })
    }
}

impl RedisBackend {
    /// One call of `acquire_all.lua` (a retry with `mine`), decoded.
    async fn acquire_all_script(
        &self,
        connection: &mut Link,
        request: &AcquireAllRequest<'_>,
    ) -> redis::RedisResult<AcquireAll> {
        let keys = request.keys;
        let bytes: usize = keys.iter().map(|keys| 4 * keys.lock.len() + 24).sum();
        let retention_ms = request.fence_retention_ms.unwrap_or(0);
        let mut cmd = evalsha(
            &ACQUIRE_ALL,
            4 * keys.len(),
            4 * keys.len() + 8,
            bytes + request.token.len() + 62 + request.member.len(),
        );
        for keys in keys {
            cmd.arg(&keys.lock)
                .arg(keys.fence())
                .arg(keys.queue())
                .arg(keys.waiters());
        }
        cmd.arg(request.token)
            .arg(request.ttl_ms)
            .arg(retention_ms)
            .arg(request.waiter_timeout_ms)
            .arg(u8::from(request.join))
            .arg(request.respect.arg())
            .arg(request.member)
            .arg(u8::from(request.mine));
        let reply: Vec<i64> =
            run(&ACQUIRE_ALL, &cmd, connection, self.connection.scripts()).await?;
        let at = |i: usize| reply.get(i).copied().unwrap_or(-1);
        let millis = |value: i64| u64::try_from(value).ok().map(Duration::from_millis);
        Ok(if at(0) == 1 {
            AcquireAll::Acquired {
                fence: request.fence_retention_ms.map(|_| at(1) as u64),
                found: (reply.len() > 2).then(|| millis(at(2)).unwrap_or(Duration::ZERO)),
            }
        } else {
            AcquireAll::Busy {
                index: usize::try_from(at(1) - 1).unwrap_or(0),
                expires_in: millis(at(2)),
            }
        })
    }
}

/// A script's release code: 1 (or 2: a waiter was told) the caller's
/// token, 0 gone, -1 another's.
fn found(code: i64) -> Found {
    match code {
        1 | 2 => Found::Mine,
        0 => Found::Gone,
        _ => Found::Other,
    }
}

impl RedisBackend {
    /// [`Backend::acquire`], called directly: the lock's own calls on one
    /// server, a cluster or Sentinel go here without the trait's box (see
    /// [`Backend::as_redis`]).
    pub(crate) async fn acquire(&self, request: AcquireRequest<'_>) -> Result<Acquire, LockError> {
        let Some(switches) = &self.switches else {
            return self.acquire_now(request).await;
        };
        // The switches learned of from here on: the hold-back below sees
        // those learned before it, the asking again below those learned while
        // the attempt ran.
        let seen = (switches.current(), Instant::now());
        let outcome = self.acquire_now(request).await;
        match outcome {
            Ok(Acquire::Acquired { .. }) if switches.current() != seen.0 => {
                let bound = request.until.unwrap_or(seen.1 + self.connection.deadline());
                Box::pin(async move {
                    // Taken on the old primary or the new one: asked again
                    // where calls go now (`mine`: a lock holding this token
                    // is found, with its remaining ttl), after the
                    // hold-back; and so again while the asking learns of a
                    // further switch (lock-sim cluster seed 9177: a
                    // failover and the one back, the second learned by the
                    // first asking again).
                    loop {
                        self.wait_out_hold_back(request.keys, bound).await?;
                        let seen = switches.current();
                        let again = AcquireRequest {
                            mine: true,
                            until: Some(bound),
                            ..request
                        };
                        let outcome = self.acquire_now(again).await;
                        match outcome {
                            Ok(Acquire::Acquired { .. }) if switches.current() != seen => {}
                            outcome => return outcome,
                        }
                    }
                })
                .await
            }
            outcome => outcome,
        }
    }

    /// A lock taken by an attempt that learned of a switch of its primary
    /// while it ran (a `MOVED`, the slot map fetched, the call sent again to
    /// the promoted replica; Sentinel naming another primary) is held back
    /// as an attempt sent after the switch is (`acquire_now`), then asked
    /// for again where calls go now. Returned at once, such a lock, taken
    /// on the new primary, ran beside the holder of a copy only the old
    /// one had, still in its section (two sections overlapped after
    /// `CLUSTER FAILOVER FORCE`, design §15); and one taken on the old
    /// primary (its reply and the news of the switch came together) is
    /// not on the new one: returned after the hold-back unchecked, it ran
    /// beside a holder there (lock-sim sentinel seed 250). A hold-back
    /// that would end past the attempt's `bound` (the switch learned late
    /// in it) ends the attempt there without an answer, as a call held
    /// back past its deadline: the lock it may hold is the acquisition's to
    /// find or give back.
    ///
    /// Waited out until no hold-back is left (a switch learned meanwhile
    /// moves its end), so that asking again, sent right after with no
    /// await between, is not held back itself: held back, a waiter's ask
    /// could end `Busy` with the lock it took left to its ttl.
    async fn wait_out_hold_back(&self, keys: &LockKeys, bound: Instant) -> Result<(), LockError> {
        let slot = || self.cluster.then(|| slots::slot(&keys.lock));
        while let Some(until) = self.held_back(slot) {
            if until > bound {
                tokio::time::sleep_until(bound).await;
                return Err(LockError::redis_at(
                    keys.name(),
                    "acquire",
                    &self.server,
                    crate::transport::timed_out(self.connection.deadline()),
                ));
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(())
    }

    /// [`acquire`](Self::acquire), the switches learned of during the
    /// attempt aside.
    async fn acquire_now(&self, mut request: AcquireRequest<'_>) -> Result<Acquire, LockError> {
        // Just after a switch of primary (boxed: a rare wait that must not
        // size the common path's future). The hold-back is part of the
        // attempt: its calls end within one deadline of its start.
        let slot = || self.cluster.then(|| slots::slot(&request.keys.lock));
        if let Some(until) = self.held_back(slot) {
            request.until = Some(Instant::now() + self.connection.deadline());
            // Not past the caller's wait: a waiter whose wait ends first
            // finds the lock busy (it is, for the holders being told),
            // and sends nothing. A try (no wait) waits out the hold-back:
            // at most half a call deadline (design §15).
            if let Some(deadline) = request.deadline.filter(|&deadline| until > deadline) {
                Box::pin(tokio::time::sleep_until(deadline)).await;
                return Ok(Acquire::Busy {
                    expires_in: Some(until.saturating_duration_since(Instant::now())),
                });
            }
            Box::pin(tokio::time::sleep_until(until)).await;
        }
        let Some(ack) = self.ack else {
            return self.acquire_once(&request).await;
        };
        // The give-back below is part of this call: it ends within one
        // call deadline of the call's start, a hold-back included (design
        // §3; lock-sim sentinel seed 58: 190 ms held back after a switch,
        // then a give-back on a connection that had stopped answering
        // took a whole deadline more).
        let until = *request
            .until
            .get_or_insert_with(|| Instant::now() + self.connection.deadline());
        let outcome = self.acquire_once(&request).await;
        let confirmed = match &outcome {
            Err(LockError::Redis { source, .. }) => match replicas_confirmed(source) {
                Some(confirmed) => Some(confirmed),
                None => return outcome,
            },
            // Found taken with this token after a call without an
            // answer: the `WAIT` of this call may have run on another
            // connection than the write, and then confirms nothing.
            Ok(Acquire::Acquired { found: Some(_), .. }) => None,
            Ok(Acquire::Acquired { .. }) => {
                self.replicas.confirmed();
                return outcome;
            }
            _ => return outcome,
        };
        // Given back, if it was taken at all: `WAIT` follows the
        // attempt whatever it did, so a busy lock (nothing written)
        // also comes back unconfirmed. The release tells which. Not
        // awaited past the call's deadline: the acquisition, which leaves
        // this attempt's outcome open on `NotReplicated`, releases the
        // token in the background then (`Unknown` in `lease/acquire.rs`),
        // as after a release that failed.
        let release = Backend::release(self, request.kind, request.keys, request.token, 0);
        let given_back = tokio::time::timeout_at(until, release).await;
        if confirmed.is_some()
            && matches!(&given_back, Ok(Ok(release)) if release.found != Found::Mine)
        {
            return Ok(Acquire::Busy { expires_in: None });
        }
        // A failed release leaves the lock to its ttl. Why it was refused:
        // the replicas the primary has (`replicas.rs`), if it says within
        // the call's deadline.
        let slot = self.cluster.then(|| slots::slot(&request.keys.lock));
        // Boxed: a rare path that must not size the common one's future.
        let connected = match confirmed {
            Some(_) => tokio::time::timeout_at(until, Box::pin(self.replicas_after_refusal(slot)))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        Err(LockError::NotReplicated {
            name: request.keys.name().to_owned(),
            confirmed,
            wanted: ack.replicas,
            timeout: Duration::from_millis(ack.timeout_ms),
            connected,
        })
    }

    /// [`Backend::release`], called directly (see [`Backend::as_redis`]).
    pub(crate) async fn release(
        &self,
        kind: Kind,
        keys: &LockKeys,
        token: &str,
        keep_ms: u64,
    ) -> Result<Release, LockError> {
        if kind != Kind::Exclusive {
            // Boxed: the shared kinds' scripts must not size the
            // exclusive release's future (see `acquire_once`).
            return Box::pin(self.call(
                keys.name(),
                "release",
                |mut connection, attempt| async move {
                    let sent_at = Instant::now();
                    let (found, woke) = self
                        .release_shared_waking(kind, keys, token, keep_ms, &mut connection)
                        .await?;
                    Ok(Release {
                        found,
                        woke,
                        retried: attempt > 0,
                        sent_at,
                    })
                },
            ))
            .await;
        }
        // Only the lock key: the wake mark in its value names the waiter
        // to wake.
        let script = if keep_ms > 0 {
            &*RELEASE_KEEPING
        } else {
            &*RELEASE
        };
        let mut cmd = evalsha(script, 1, 3, keys.lock.len() + token.len() + 20);
        cmd.arg(&keys.lock).arg(token);
        if keep_ms > 0 {
            cmd.arg(keep_ms);
        }
        self.release_call(keys.name(), script, &cmd).await
    }

    /// [`release`](Self::release) of a hold taken by a plain `SET NX PX`
    /// (`plain`), whose key most likely holds exactly its token: by the
    /// server's plain conditional delete (`DELIFEQ`, `DELEX ... IFEQ`) when
    /// the connection's server has one, else (and when it answers that the
    /// key holds something else: a wake mark, another holder's token, or
    /// nothing) by the script, which tells which and wakes the marked
    /// waiter. The command deletes only a key that holds exactly the token,
    /// which no other acquisition ever uses (design §2, "A release without
    /// Lua").
    pub(crate) async fn release_hinted(
        &self,
        kind: Kind,
        keys: &LockKeys,
        token: &str,
        keep_ms: u64,
        plain: bool,
    ) -> Result<Release, LockError> {
        if !plain
            || kind != Kind::Exclusive
            || keep_ms > 0
            || self.conditional_refused.load(Ordering::Relaxed)
        {
            return self.release(kind, keys, token, keep_ms).await;
        }
        let mut script = evalsha(&RELEASE, 1, 2, keys.lock.len() + token.len() + 20);
        script.arg(&keys.lock).arg(token);
        let (script, scripts) = (&script, self.connection.scripts());
        self.call(
            keys.name(),
            "release",
            |mut connection, attempt| async move {
                // A retry (the first try's outcome unknown) is the script,
                // which may find the key gone by the first try's doing.
                let how = connection.conditional_delete();
                if attempt == 0 && how != ConditionalDelete::None {
                    let sent_at = Instant::now();
                    let mut delete = Cmd::with_capacity(4, keys.lock.len() + token.len() + 24);
                    match how {
                        ConditionalDelete::DelExIfEq => {
                            delete.arg("DELEX").arg(&keys.lock).arg("IFEQ").arg(token);
                        }
                        _ => {
                            delete.arg("DELIFEQ").arg(&keys.lock).arg(token);
                        }
                    }
                    match connection.req_packed_command(&delete).await? {
                        Value::Int(1) => {
                            return Ok(Release {
                                found: Found::Mine,
                                woke: false,
                                retried: false,
                                sent_at,
                            })
                        }
                        // Not exactly the token: the script tells which.
                        Value::Int(0) => {}
                        // Refused (an ACL without the command), or not what
                        // the command answers: the script from now on.
                        _ => self.conditional_refused.store(true, Ordering::Relaxed),
                    }
                }
                let sent_at = Instant::now();
                let code = self.told(run(&RELEASE, script, &mut connection, scripts).await?);
                Ok(Release {
                    found: found(code),
                    woke: code == 2,
                    retried: attempt > 0,
                    sent_at,
                })
            },
        )
        .await
    }

    /// Runs the release script `script` as `cmd` (its code: 2 released and
    /// a waiter told, 1 released, 0 gone, -1 another's), under the call
    /// deadline.
    pub(super) async fn release_call(
        &self,
        name: &str,
        script: &LuaScript,
        cmd: &Cmd,
    ) -> Result<Release, LockError> {
        let scripts = self.connection.scripts();
        self.call(name, "release", |mut connection, attempt| async move {
            let sent_at = Instant::now();
            let code = self.told(run(script, cmd, &mut connection, scripts).await?);
            Ok(Release {
                found: found(code),
                woke: code == 2,
                retried: attempt > 0,
                sent_at,
            })
        })
        .await
    }
}

impl Backend for RedisBackend {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, LockError>> {
        Box::pin(self.acquire(request))
    }

    fn as_redis(&self) -> Option<&RedisBackend> {
        Some(self)
    }

    fn switches(&self) -> Option<Arc<Switches>> {
        self.switches.clone()
    }

    fn passes_in_process(&self) -> bool {
        self.ack.is_none()
    }

    fn takes_together(&self, keys: &[LockKeys]) -> bool {
        if self.ack.is_some() {
            return false;
        }
        let mut slots = keys.iter().map(|keys| slots::slot(&keys.lock));
        let first = slots.next();
        !self.cluster || slots.all(|slot| Some(slot) == first)
    }

    fn acquire_all<'a>(
        &'a self,
        request: AcquireAllRequest<'a>,
    ) -> BoxFuture<'a, Result<AcquireAll, LockError>> {
        Box::pin(async move {
            let name = request.keys.first().map_or("", LockKeys::name);
            // Just after a switch of primary (see `acquire`).
            let slot = || {
                let first = request.keys.first()?;
                self.cluster.then(|| slots::slot(&first.lock))
            };
            // The hold-back is part of the attempt: it ends within one
            // deadline of its start (as `acquire`; lock-sim sentinel seed
            // 112: a set's attempt 1.48 s against 1.24 s).
            let seen = self
                .switches
                .as_ref()
                .map(|switches| (switches.current(), Instant::now()));
            let mut ends = None;
            if let Some(until) = self.held_back(slot) {
                ends = Some(Instant::now() + self.connection.deadline());
                tokio::time::sleep_until(until).await;
            }
            let outcome = self
                .call_until(
                    name,
                    "acquire",
                    ends,
                    |mut connection, attempt| async move {
                        let retry = AcquireAllRequest {
                            mine: request.mine || attempt > 0,
                            ..request
                        };
                        self.acquire_all_script(&mut connection, &retry).await
                    },
                )
                .await;
            // A switch learned of while the attempt ran (see `acquire`).
            match (seen, &self.switches, request.keys.first()) {
                (Some((count, started)), Some(switches), Some(first))
                    if matches!(outcome, Ok(AcquireAll::Acquired { .. }))
                        && switches.current() != count =>
                {
                    let bound = started + self.connection.deadline();
                    loop {
                        self.wait_out_hold_back(first, bound).await?;
                        let seen = switches.current();
                        let outcome = self
                            .call_until(
                                name,
                                "acquire",
                                Some(bound),
                                |mut connection, _| async move {
                                    let again = AcquireAllRequest {
                                        mine: true,
                                        ..request
                                    };
                                    self.acquire_all_script(&mut connection, &again).await
                                },
                            )
                            .await;
                        match outcome {
                            Ok(AcquireAll::Acquired { .. }) if switches.current() != seen => {}
                            outcome => return outcome,
                        }
                    }
                }
                _ => outcome,
            }
        })
    }

    fn fence_at_least<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: u64,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(self.raise_fence(keys, token, retention_ms))
    }

    fn partition<'a>(&'a self, items: &'a [RenewItem<'a>]) -> BoxFuture<'a, Vec<Vec<usize>>> {
        Box::pin(async move {
            if !self.cluster {
                return Vec::new();
            }
            self.cluster_groups(items)
                .await
                .into_iter()
                .map(|group| group.slots.concat())
                .collect()
        })
    }

    fn release<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        token: &'a str,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<Release, LockError>> {
        Box::pin(self.release(kind, keys, token, keep_ms))
    }

    fn leave<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        member: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            if kind != Kind::Exclusive {
                return self.leave_shared(kind, keys, member).await;
            }
            let mut cmd = evalsha(&LEAVE, 3, 4, 3 * keys.lock.len() + 16 + member.len());
            cmd.arg(&keys.lock)
                .arg(keys.queue())
                .arg(keys.waiters())
                .arg(member);
            let (cmd, scripts) = (&cmd, self.connection.scripts());
            self.call(
                keys.name(),
                "leave the queue",
                |mut connection, _| async move {
                    run::<Told>(&LEAVE, cmd, &mut connection, scripts)
                        .await
                        .map(|told| self.told(told))
                },
            )
            .await
            .map(|_| ())
        })
    }

    fn pass<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        next: &'a str,
        ttl_ms: u64,
        fence_retention_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Pass, LockError>> {
        Box::pin(async move {
            let mut cmd = evalsha(
                &HANDOFF,
                2,
                6,
                2 * keys.lock.len() + token.len() + next.len() + 48,
            );
            cmd.arg(&keys.lock)
                .arg(keys.fence())
                .arg(token)
                .arg(next)
                .arg(ttl_ms)
                .arg(fence_retention_ms.unwrap_or(0));
            let (cmd, scripts) = (&cmd, self.connection.scripts());
            let reply: Vec<i64> = self
                .call(keys.name(), "hand-off", |mut connection, _| async move {
                    run(&HANDOFF, cmd, &mut connection, scripts).await
                })
                .await?;
            Ok(match reply.first() {
                Some(1) => Pass::Passed {
                    fence: fence_retention_ms.map(|_| reply.get(1).copied().unwrap_or(0) as u64),
                    queued: reply.get(2) == Some(&1),
                },
                Some(0) => Pass::Refused(Found::Gone),
                _ => Pass::Refused(Found::Other),
            })
        })
    }

    fn renew<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
        round_trips: &'a AtomicU64,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Option<Found>>>> {
        Box::pin(async move {
            let found = self.renew_all(items, round_trips).await?;
            Ok(found.into_iter().map(Some).collect())
        })
    }

    fn call_deadline(&self) -> Duration {
        self.connection.deadline()
    }

    fn scan<'a>(
        &'a self,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<String>>, LockError>> {
        Box::pin(async move { Ok(vec![self.scan_keys(pattern, count).await?]) })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
        keys: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Snapshot>, LockError>> {
        Box::pin(async move { Ok(vec![self.snapshot(name, keys).await?]) })
    }

    fn peek<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, Result<Vec<Option<Peeked>>, LockError>> {
        Box::pin(async move { Ok(vec![Some(self.peek_lock(keys).await?)]) })
    }

    fn write_record<'a>(
        &'a self,
        write: &'a RecordWrite<'a>,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.write_holder_record(write))
    }

    fn read_record<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, LockError>> {
        Box::pin(self.read_holder_record(key))
    }
}
