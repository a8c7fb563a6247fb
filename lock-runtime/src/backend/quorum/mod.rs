//! RedLock (seed 003): one lock over N independent Redis masters, held when
//! a majority granted it within its validity; with a fencing token that
//! every later majority sees.
//!
//! Each node is a [`RedisBackend`] on its own server; every call goes to all
//! N at once, each with its own short timeout, and counts the answers:
//!
//! - **Acquire** (`attempt.rs`): the same value (the holder's token, then
//!   `|q<n>`, the attempt's number) to every node. Held when at least
//!   N/2+1 granted it and the validity left (ttl - elapsed - drift, from the
//!   start of this attempt: the hold's own clock, §5) is positive; otherwise
//!   given back where it may have been granted. A node that failed its last
//!   call is not waited for when only it could still decide.
//! - **Waiting**: waiters stand in one line per node, ordered by a ticket
//!   each waiter sends unchanged to every node, so every node names the same
//!   first waiter and defers to it: split votes do not repeat. A release (or
//!   a failed attempt's give-back) wakes the first waiter in line on each
//!   node; the client listens on every node.
//! - **Fencing**: each granting node hands out its own next token (the
//!   server clock in µs, or its last + 1); the acquisition's token is the
//!   highest of them, written back (`fence_raise.lua`) to every node, and
//!   the acquisition holds only once a majority has it (the others get it in
//!   the background). Any later majority shares a node with that one, whose
//!   next token is larger.
//! - **Renewal**: counts for a lock only if a majority extended it; a lock a
//!   majority no longer holds is lost; anything in between (nodes that did
//!   not answer) is a failed renewal, tried again while the lock is valid.
//!   A node that lost the key (restarted without data) does not get it back:
//!   a renewal extends, it never re-creates.
//! - **Release**: on every node; reported as lost if a majority no longer
//!   held it.
//! - **In-process hand-off** (`handoff.rs`): the lock passed from one task
//!   of the client to the next, held once a majority swapped the passer's
//!   value for the next holder's token.

mod attempt;
mod handoff;
mod nodes;
mod slots;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use self::attempt::{undecided, unreachable, QuorumClock};
use self::nodes::{answered, Nodes, Silence};
use super::RedisBackend;
use super::{
    Acquire, AcquireRequest, Backend, Found, Kind, Pass, Peeked, RecordWrite, Release, RenewItem,
    Snapshot, WaitPlace,
};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::token::Random;

/// How long the nodes yet to answer a renewal are waited for, at least, once
/// a majority answered and only they could still decide some lock: nodes
/// that failed their last call, and the others.
const DOWN_PATIENCE: Duration = Duration::from_millis(10);
const UP_PATIENCE: Duration = Duration::from_millis(50);

/// Attempts of a semaphore's try, at most: the first asks for slots at
/// random, the others for slots the nodes reported free.
const SLOT_ROUNDS: u32 = 3;

pub(crate) struct QuorumBackend {
    nodes: Arc<Nodes>,
    deadline: Duration,
    /// The nodes' time, for waiters' tickets.
    clock: QuorumClock,
    /// The client's random source: the pauses after split votes, the
    /// semaphore slots first asked for.
    random: Random,
}

impl QuorumBackend {
    /// A quorum of `nodes`, each with the `host:port` it is reported by.
    pub(crate) fn new(
        nodes: Vec<(RedisBackend, String)>,
        deadline: Duration,
        random: Random,
    ) -> QuorumBackend {
        QuorumBackend {
            nodes: Arc::new(Nodes::new(nodes)),
            deadline,
            clock: QuorumClock::default(),
            random,
        }
    }

    /// Writes a fenced acquisition's token back to every node (each node's
    /// last token becomes at least `token`) and returns how many confirmed
    /// it, as soon as a majority did or no longer can (at most `timeout`).
    /// The writes go on in the background: every node that answers gets the
    /// token, not only the first majority (the more nodes have it, the more
    /// restarts without data a later majority can tolerate, design §13), and
    /// a stopped node does not hold up the acquisition.
    async fn write_back(
        &self,
        keys: &LockKeys,
        token: u64,
        retention_ms: u64,
        timeout: Duration,
    ) -> usize {
        let (answers, mut confirmed) = tokio::sync::mpsc::unbounded_channel();
        let (nodes, keys) = (Arc::clone(&self.nodes), keys.clone());
        tokio::spawn(async move {
            let mut writes: FuturesUnordered<_> = nodes
                .iter()
                .map(|node| node.redis.raise_fence(&keys, token, retention_ms))
                .collect();
            while let Some(answer) = writes.next().await {
                let _ = answers.send(answer.is_ok());
            }
        });
        let (quorum, nodes) = (self.nodes.quorum(), self.nodes.len());
        let (mut raised, mut failed) = (0, 0);
        let _ = tokio::time::timeout(timeout, async {
            while let Some(ok) = confirmed.recv().await {
                if ok {
                    raised += 1;
                } else {
                    failed += 1;
                }
                if raised >= quorum || failed > nodes - quorum {
                    break;
                }
            }
        })
        .await;
        raised
    }
}

/// How long a release waits, from its send, for the nodes that answered
/// their last call once a majority decided it: as long as the longest
/// per-node timeout of an attempt.
const RELEASE_PATIENCE: Duration = Duration::from_millis(500);

impl Backend for QuorumBackend {
    fn fence_at_least<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: u64,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let raised = self
                .write_back(keys, token, retention_ms, self.deadline)
                .await;
            if raised >= self.nodes.quorum() {
                return Ok(());
            }
            Err(LockError::redis(
                keys.name(),
                "fencing write-back",
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "too few nodes took the fencing token",
                    format!("{raised} of {} nodes", self.nodes.len()),
                )),
            ))
        })
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, LockError>> {
        Box::pin(async move {
            if !matches!(request.kind, Kind::Semaphore { .. }) || request.place.is_some() {
                return self.attempt(request).await;
            }
            // A semaphore's try (or a waiter's first attempt) asks for slots
            // at random: when the nodes report other slots free on a
            // majority, it asks again for those at once, so that a try is
            // not `Busy` only because it guessed taken slots.
            let local = WaitPlace::default();
            let mut round = 0;
            // Another round only while a whole one fits in the call
            // deadline: a try ends within one call deadline.
            let started = Instant::now();
            let room = || {
                started.elapsed() + attempt::node_timeout(request.ttl_ms, self.deadline)
                    <= self.deadline
            };
            loop {
                let outcome = self
                    .attempt(AcquireRequest {
                        place: Some(&local),
                        ..request
                    })
                    .await;
                round += 1;
                match outcome {
                    Ok(Acquire::Busy { .. })
                        if round < SLOT_ROUNDS && slots::promising(&local) && room() => {}
                    outcome => return outcome,
                }
            }
        })
    }

    fn release<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        token: &'a str,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<Release, LockError>> {
        Box::pin(async move {
            let sent_at = Instant::now();
            // Sent to every node in the background; settled as soon as the
            // answers decide it (a majority released it, or no longer held
            // it), so a stopped node does not hold the release up; the
            // others still get it. An exclusive lock's release wakes the
            // first waiter queued on each node (`hold_at_least` keeps the
            // key: nobody to wake).
            // A read share's, a writer's or a semaphore holder's release
            // wakes the first waiter in line if it could enter now; a
            // writer's `hold_at_least` keeps the writer key as the
            // exclusive lock's does.
            let keeping = keep_ms > 0 && matches!(kind, Kind::Exclusive | Kind::Write);
            let waking = !keeping;
            let kind = if keeping { Kind::Exclusive } else { kind };
            let shared = Arc::new((keys.clone(), token.to_owned()));
            let deadline = self.deadline;
            let mut releases: FuturesUnordered<_> = (0..self.nodes.len())
                .map(|i| {
                    let (nodes, shared) = (Arc::clone(&self.nodes), Arc::clone(&shared));
                    async move {
                        let (node, (keys, token)) = (&nodes[i].redis, &*shared);
                        if let Some(refused) = nodes[i].refusing(keys.name(), "release") {
                            nodes[i].saw(Some(false));
                            return (i, Some(Err(refused)));
                        }
                        let release = async {
                            if waking {
                                node.release_waking(kind, keys, token, "").await
                            } else {
                                node.release(kind, keys, token, keep_ms).await
                            }
                        };
                        // Bounded by the call's own deadline (`Connection::call`):
                        // no timer of its own.
                        let answer = Some(release.await);
                        if let Some(result) = &answer {
                            nodes[i].after(result);
                        }
                        nodes[i].saw(Some(answer.as_ref().is_some_and(answered)));
                        (i, answer)
                    }
                })
                .collect();
            let (quorum, nodes) = (self.nodes.quorum(), self.nodes.len());
            let (mut mine, mut not, mut other) = (0, 0, false);
            let (mut retried, mut woke) = (false, false);
            let mut failed: Vec<(usize, Silence)> = Vec::new();
            let mut heard = vec![false; nodes];
            while let Some((node, answer)) = releases.next().await {
                heard[node] = true;
                let release = match answer {
                    Some(Ok(release)) => release,
                    Some(Err(error)) => {
                        failed.push((node, Silence::Failed(error)));
                        continue;
                    }
                    None => {
                        failed.push((node, Silence::NoAnswer(deadline)));
                        continue;
                    }
                };
                retried |= release.retried;
                woke |= release.woke;
                match release.found {
                    Found::Mine => mine += 1,
                    Found::Other => {
                        not += 1;
                        other = true;
                    }
                    Found::Gone => not += 1,
                }
                if mine >= quorum || not > nodes - quorum {
                    break;
                }
            }
            let carried = mine >= quorum || not > nodes - quorum;
            // The nodes that answered their last call are waited for too,
            // for at most `RELEASE_PATIENCE` from the send, so that a
            // release that returns has reached every node that answers: a
            // process that exits right after it leaves no node holding the
            // lock for nobody until its ttl. On a healthy quorum they
            // answer moments after the majority. A node that stopped since
            // its last answer holds up this release for that long once,
            // and is then known as down; the others (down, or not heard
            // from yet) are not waited for. What is left is heard out in
            // the background. (The patience ends no earlier than the timers
            // of the attempt before it, so arming it does not wake the I/O
            // driver; a grace of a few ms did, on every release: issue 40.)
            if carried {
                let patience = sent_at + RELEASE_PATIENCE.min(deadline);
                let _ = tokio::time::timeout_at(patience, async {
                    while (0..nodes).any(|node| !heard[node] && self.nodes[node].is_up()) {
                        let Some((node, answer)) = releases.next().await else {
                            break;
                        };
                        heard[node] = true;
                        if !matches!(answer, Some(Ok(_))) {
                            failed.push((node, Silence::NoAnswer(deadline)));
                        }
                    }
                })
                .await;
            }
            if carried && !releases.is_empty() {
                let nodes = Arc::clone(&self.nodes);
                tokio::spawn(async move {
                    while let Some((node, answer)) = releases.next().await {
                        if !matches!(answer, Some(Ok(_))) {
                            nodes.failed(node, "release");
                        }
                    }
                });
            }
            if carried {
                for (node, _) in &failed {
                    self.nodes.failed(*node, "release");
                }
            }
            let found = if mine >= quorum {
                Found::Mine
            } else if not > nodes - quorum {
                // A majority no longer held it.
                if other {
                    Found::Other
                } else {
                    Found::Gone
                }
            } else {
                // The nodes that did not answer could still hold it.
                let answers = mine + not;
                let mut silent = failed;
                silent.extend(
                    (0..nodes)
                        .filter(|&node| !heard[node])
                        .map(|node| (node, Silence::NoAnswer(sent_at.elapsed()))),
                );
                if answers < quorum {
                    return Err(unreachable(&self.nodes, keys, "release", answers, silent));
                }
                return Err(undecided(&self.nodes, keys, mine, not, silent));
            };
            Ok(Release {
                found,
                woke,
                retried,
                sent_at,
            })
        })
    }

    fn leave<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        member: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        // Out of the line on every node that answers; a node that does not
        // drops the place when its refresh deadline passes.
        Box::pin(async move {
            join_all(self.nodes.iter().map(|node| {
                tokio::time::timeout(self.deadline, node.redis.leave_line(kind, keys, member))
            }))
            .await;
            Ok(())
        })
    }

    fn give_back<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        own: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        // In the background, on every node that answers (a node that does
        // not lets the value expire; a stopped one must not hold the set's
        // next round up), as a failed attempt's give-back: the set's own
        // place is not woken. The value is the attempt's own, so a late
        // give-back cannot touch a later round's.
        let (nodes, deadline) = (Arc::clone(&self.nodes), self.deadline);
        let (keys, token, own) = (keys.clone(), token.to_owned(), own.to_owned());
        tokio::spawn(async move {
            join_all(nodes.iter().map(|node| {
                let release = node
                    .redis
                    .release_waking(Kind::Exclusive, &keys, &token, &own);
                tokio::time::timeout(deadline, release)
            }))
            .await;
        });
        Box::pin(async { Ok(()) })
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
            if fence_retention_ms.is_some() {
                // Never asked: `passes_fenced_in_process` is false (a
                // fencing token over a quorum is written back to a
                // majority, a second round trip a pass does not make).
                return Err(ConfigError::Unsupported {
                    name: keys.name().to_owned(),
                    reason: "no fenced in-process hand-off over a quorum",
                }
                .into());
            }
            self.pass_to_next(keys, token, next, ttl_ms).await
        })
    }

    fn renew<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
        round_trips: &'a AtomicU64,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Option<Found>>>> {
        Box::pin(async move {
            // Settled as soon as every lock is decided by the answers so
            // far (a majority extended it, or can no longer), not after the
            // slowest node.
            let mut pending: FuturesUnordered<_> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, node)| async move {
                    let answer =
                        tokio::time::timeout(self.deadline, node.redis.renew(items, round_trips))
                            .await
                            .ok();
                    node.saw(Some(matches!(answer, Some(Ok(_)))));
                    (i, answer)
                })
                .collect();
            // Nodes that refused the renewal (a permission, a script
            // error): answered the same way every time.
            let mut refused = 0;
            let mut refusal = None;
            let (quorum, nodes) = (self.nodes.quorum(), self.nodes.len());
            // Per lock: nodes that extended it, nodes that answered it was
            // not there (or another's); and the nodes yet to answer.
            let mut mine = vec![0usize; items.len()];
            let mut not = vec![0usize; items.len()];
            let mut other = vec![false; items.len()];
            let mut silent = nodes;
            let mut heard = vec![false; nodes];
            let started = Instant::now();
            // Once only nodes that failed their last call are yet to answer,
            // they are waited for briefly (as by an attempt): a lock they
            // alone could decide is tried again alone, and the others' new
            // validity is not held up for the call deadline.
            let mut cutoff: Option<Instant> = None;
            loop {
                let next = match cutoff {
                    Some(at) => match tokio::time::timeout_at(at, pending.next()).await {
                        Ok(next) => next,
                        Err(_) => {
                            // Not waited for again until they answer.
                            for node in (0..nodes).filter(|&node| !heard[node]) {
                                self.nodes[node].saw(Some(false));
                            }
                            break;
                        }
                    },
                    None => pending.next().await,
                };
                let Some((node, answer)) = next else { break };
                let answer = match answer {
                    Some(Ok(answer)) => Some(answer),
                    Some(Err(error)) if super::is_refusal(&error) => {
                        refused += 1;
                        refusal = Some(error);
                        None
                    }
                    _ => None,
                };
                silent -= 1;
                heard[node] = true;
                if answer.is_none() {
                    self.nodes.failed(node, "renewal");
                }
                // A node that failed to answer counts as neither.
                for (i, code) in answer.into_iter().flatten().enumerate() {
                    let Some(code) = code else { continue };
                    match code {
                        Found::Mine => mine[i] += 1,
                        Found::Other => {
                            not[i] += 1;
                            other[i] = true;
                        }
                        Found::Gone => not[i] += 1,
                    }
                }
                let decided =
                    (0..items.len()).all(|i| mine[i] >= quorum || not[i] > nodes - quorum);
                if decided || silent == 0 {
                    break;
                }
                // Once a majority answered, the undecided locks wait for the
                // others only briefly (a node that failed its last call
                // more briefly still): such a lock is tried again alone,
                // and the decided ones' new validity must not wait for a
                // stopped node's call deadline.
                if cutoff.is_none() && nodes - silent >= quorum {
                    let only_down =
                        (0..nodes).all(|node| heard[node] || self.nodes[node].is_down());
                    let patience = if only_down {
                        (started.elapsed() * 2).max(DOWN_PATIENCE)
                    } else {
                        (started.elapsed() * 4).max(UP_PATIENCE)
                    };
                    cutoff = Some(Instant::now() + patience);
                }
            }
            if let Some(refusal) = refusal.filter(|_| refused > nodes - quorum) {
                // Too many nodes refuse for a majority ever to confirm.
                return Err(refusal);
            }
            let mut found = Vec::with_capacity(items.len());
            for i in 0..items.len() {
                if mine[i] >= quorum {
                    found.push(Some(Found::Mine));
                } else if not[i] > nodes - quorum {
                    // A majority no longer holds it: lost.
                    found.push(Some(if other[i] { Found::Other } else { Found::Gone }));
                } else {
                    // Nodes that did not answer could have made a majority:
                    // not a loss yet, a failed renewal of this lock alone
                    // (tried again while the lock is valid).
                    found.push(None);
                }
            }
            Ok(found)
        })
    }

    fn call_deadline(&self) -> Duration {
        self.deadline
    }

    fn passes_in_process(&self) -> bool {
        true
    }

    fn passes_fenced_in_process(&self) -> bool {
        false
    }

    fn scan<'a>(
        &'a self,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<String>>, LockError>> {
        // Every node on its own (each is a whole keyspace); all must answer.
        Box::pin(async move {
            join_all(
                self.nodes
                    .iter()
                    .map(|node| node.redis.scan_keys(pattern, count)),
            )
            .await
            .into_iter()
            .collect()
        })
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
        keys: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Snapshot>, LockError>> {
        Box::pin(async move {
            join_all(
                self.nodes
                    .iter()
                    .map(|node| node.redis.snapshot(name, keys)),
            )
            .await
            .into_iter()
            .collect()
        })
    }

    fn peek<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, Result<Vec<Option<Peeked>>, LockError>> {
        // Every node under its own deadline: a stopped node is `None`.
        Box::pin(async move {
            Ok(join_all(self.nodes.iter().map(|node| async move {
                tokio::time::timeout(self.deadline, node.redis.peek_lock(keys))
                    .await
                    .ok()
                    .and_then(Result::ok)
            }))
            .await)
        })
    }

    fn write_record<'a>(
        &'a self,
        write: &'a RecordWrite<'a>,
    ) -> BoxFuture<'a, Result<bool, LockError>> {
        // Every node, each under its own deadline: a stopped node fails the
        // write (which the writer then repeats whole), not the others.
        Box::pin(async move {
            let answers = join_all(self.nodes.iter().map(|node| async move {
                tokio::time::timeout(self.deadline, node.redis.write_holder_record(write))
                    .await
                    .unwrap_or_else(|_| {
                        Err(LockError::redis(
                            write.key,
                            "write of the holder record",
                            crate::transport::timed_out(self.deadline),
                        ))
                    })
            }))
            .await;
            let mut existed = true;
            for answer in answers {
                existed &= answer?;
            }
            Ok(existed)
        })
    }

    fn read_record<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, LockError>> {
        Box::pin(async move {
            let answers = join_all(self.nodes.iter().map(|node| async move {
                tokio::time::timeout(self.deadline, node.redis.read_holder_record(key))
                    .await
                    .unwrap_or_else(|_| {
                        Err(LockError::redis(
                            key,
                            "read of the holder record",
                            crate::transport::timed_out(self.deadline),
                        ))
                    })
            }))
            .await;
            let mut merged: Vec<(String, String)> = Vec::new();
            let mut first_error = None;
            let mut answered = false;
            for answer in answers {
                match answer {
                    Ok(fields) => {
                        answered = true;
                        for (field, value) in fields {
                            if !merged.iter().any(|(known, _)| *known == field) {
                                merged.push((field, value));
                            }
                        }
                    }
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
            match first_error {
                Some(error) if !answered => Err(error),
                _ => Ok(merged),
            }
        })
    }
}
