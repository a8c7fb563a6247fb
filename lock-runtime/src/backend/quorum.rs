//! RedLock (seed 003): one lock over N independent Redis masters, held when
//! a majority granted it within its validity; with a fencing token that
//! every later majority sees.
//!
//! Each node is a [`RedisBackend`] on its own server; every call goes to all
//! N at once, each with its own short timeout, and counts the answers:
//!
//! - **Acquire**: the same token to every node (a plain `SET NX PX`, or the
//!   acquire script with a fencing token). Held when at least N/2+1 granted
//!   it and the validity left (ttl - elapsed - drift, from the start of this
//!   attempt: the hold's own clock, §5) is positive. Otherwise it is given
//!   back on every node, those that failed or did not answer included
//!   (their outcome is unknown). Each attempt writes its own value (the
//!   holder's token, then `|q<random>`), so that a give-back arriving late
//!   never deletes a later attempt's grant.
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
//! - **Waiting**: a waiter queues on every node and is woken by the release
//!   (`quorum_release.lua` wakes the first waiter queued on each node; the
//!   client listens on one node); it also tries again after a random pause
//!   (20-120 ms), so waiters do not all come at once. Not served in queue
//!   order (`fair` is refused: the nodes' queues need not agree); a client
//!   that just woke a waiter defers to it once, for a head start. A winner
//!   leaves the queues of the nodes that did not grant it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, BoxFuture};
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::RedisBackend;
use super::{Acquire, AcquireRequest, Backend, Found, Kind, Pass, Release, RenewItem, Snapshot};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;

pub(crate) struct QuorumBackend {
    nodes: Arc<Vec<RedisBackend>>,
    deadline: Duration,
    warnings: Arc<NodeWarnings>,
}

/// The warnings about nodes whose failures the quorum carried.
struct NodeWarnings {
    /// When each node's failure was last logged (ms since `started`).
    warned: Vec<AtomicU64>,
    started: Instant,
}

impl NodeWarnings {
    /// A node failed a call that the quorum carried anyway: not returned,
    /// so logged (at most every [`WARN_EVERY`] per node), since the quorum
    /// now tolerates one failure less.
    fn failed(&self, node: usize, what: &str) {
        let now = self.started.elapsed().as_millis() as u64 + WARN_EVERY.as_millis() as u64;
        let last = self.warned[node].load(Ordering::Relaxed);
        if now >= last + WARN_EVERY.as_millis() as u64
            && self.warned[node]
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(node, "a quorum node failed a {what} the others carried; the quorum tolerates one failure less until it is back");
        }
    }
}

/// The least time between two warnings about one node.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// How long a client that just woke a waiter, and deferred to it, waits
/// before it tries again without deferring (it is woken sooner by the next
/// release): the woken waiter's head start.
const WOKEN_WAITER_HEAD_START: Duration = Duration::from_millis(200);

/// The shortest ttl over a quorum: shorter, the drift allowance (1 % + 2 ms)
/// and a round trip leave no validity.
const MIN_QUORUM_TTL_MS: u64 = 10;

/// How long each node may take to answer an attempt made at (or after) the
/// end of a wait.
const LAST_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(5);

/// The pause range between a waiter's attempts, in ms.
const RETRY_JITTER_MS: (u64, u64) = (20, 120);

impl QuorumBackend {
    pub(crate) fn new(nodes: Vec<RedisBackend>, deadline: Duration) -> QuorumBackend {
        QuorumBackend {
            warnings: Arc::new(NodeWarnings {
                warned: nodes.iter().map(|_| AtomicU64::new(0)).collect(),
                started: Instant::now(),
            }),
            nodes: Arc::new(nodes),
            deadline,
        }
    }

    /// See [`NodeWarnings::failed`].
    fn node_failed(&self, node: usize, what: &str) {
        self.warnings.failed(node, what);
    }

    /// N/2 + 1.
    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Each node's answer to `call`, `None` for one that did not answer
    /// within `timeout`; all nodes at once.
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        call: F,
    ) -> Vec<Option<Result<T, LockError>>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T, LockError>> + 'a,
    {
        join_all(
            self.nodes
                .iter()
                .map(|node| async { tokio::time::timeout(timeout, call(node)).await.ok() }),
        )
        .await
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
                .map(|node| node.raise_fence(&keys, token, retention_ms))
                .collect();
            while let Some(answer) = writes.next().await {
                let _ = answers.send(answer.is_ok());
            }
        });
        let (quorum, nodes) = (self.quorum(), self.nodes.len());
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

    /// A waiter that won on a majority leaves the queue on the nodes that
    /// did not grant it (in the background), so that their releases wake
    /// the next waiter, not one that holds the lock.
    fn leave_elsewhere(&self, request: &AcquireRequest<'_>, granting: &[bool]) {
        if !request.join || granting.iter().all(|granted| *granted) {
            return;
        }
        let others: Vec<usize> = (0..granting.len()).filter(|&i| !granting[i]).collect();
        let (nodes, keys) = (Arc::clone(&self.nodes), request.keys.clone());
        let (kind, member) = (request.kind, request.member.to_owned());
        tokio::spawn(async move {
            join_all(
                others
                    .iter()
                    .map(|&node| nodes[node].leave(kind, &keys, &member)),
            )
            .await;
        });
    }

    /// Gives the attempt's value back on every node, in the background
    /// (each release within its call deadline).
    fn give_back(&self, keys: &LockKeys, value: String) {
        let (nodes, keys) = (Arc::clone(&self.nodes), keys.clone());
        tokio::spawn(async move {
            join_all(
                nodes
                    .iter()
                    .map(|node| node.release(Kind::Exclusive, &keys, &value, 0)),
            )
            .await;
        });
    }
}

/// How long one node may take to answer an acquisition: a small fraction
/// of the ttl (a slow node must not eat the validity), within the call
/// deadline.
fn node_timeout(ttl_ms: u64, deadline: Duration) -> Duration {
    Duration::from_millis(ttl_ms / 10)
        .clamp(Duration::from_millis(5), Duration::from_millis(500))
        .min(deadline)
}

/// The time a lock's validity is cut by for clock drift between the
/// client and the nodes: 1 % of the ttl + 2 ms (seed 003).
fn drift(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms / 100 + 2)
}

/// A random mark of one attempt (8 hex digits).
fn attempt_mark() -> String {
    let mut bytes = [0u8; 4];
    let _ = getrandom::fill(&mut bytes);
    format!("{:08x}", u32::from_be_bytes(bytes))
}

/// A pause for a waiter's next attempt, in the jitter range.
fn jitter() -> Duration {
    let mut byte = [0u8; 1];
    let _ = getrandom::fill(&mut byte);
    let (low, high) = RETRY_JITTER_MS;
    Duration::from_millis(low + u64::from(byte[0]) * (high - low) / 255)
}

/// The error of an attempt that a majority granted, but whose validity ran
/// out before it was held (the nodes answered too slowly for the ttl, or the
/// fencing write-back did not reach a majority in time). Given back.
fn not_held_in_time(keys: &LockKeys, elapsed: Duration, ttl_ms: u64) -> LockError {
    LockError::redis(
        keys.name(),
        "acquire",
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "a majority granted the lock, but after {elapsed:?} of its {ttl_ms} ms ttl no \
                 validity was left (or its fencing token did not reach a majority in time); it \
                 was given back: give a longer ttl, or check the nodes' latency"
            ),
        )
        .into(),
    )
}

/// The error of a majority that did not answer.
fn no_majority(
    keys: &LockKeys,
    operation: &'static str,
    answered: usize,
    quorum: usize,
) -> LockError {
    LockError::redis(
        keys.name(),
        operation,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("only {answered} node(s) answered; a majority of {quorum} is needed"),
        )
        .into(),
    )
}

impl Backend for QuorumBackend {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, LockError>> {
        Box::pin(async move {
            if request.kind != Kind::Exclusive {
                return Err(ConfigError::Unsupported {
                    name: request.keys.name().to_owned(),
                    reason: "read/write locks and semaphores are not available over a quorum \
                             (RedLock) yet; use an exclusive lock",
                }
                .into());
            }
            if request.fair {
                return Err(ConfigError::Unsupported {
                    name: request.keys.name().to_owned(),
                    reason: "`fair` is not available over a quorum (RedLock): the nodes' queues \
                             need not agree on who is first, and serving each node's first \
                             waiter could leave nobody with a majority; drop `fair`",
                }
                .into());
            }
            if request.ttl_ms < MIN_QUORUM_TTL_MS {
                return Err(ConfigError::InvalidTtl {
                    name: request.keys.name().to_owned(),
                    ttl: Duration::from_millis(request.ttl_ms),
                    reason: "too short for a quorum (its validity is cut by 1 % + 2 ms for clock \
                             drift): give at least 10 ms",
                }
                .into());
            }
            let started = Instant::now();
            // The value this attempt writes: the holder's token and a mark
            // of this attempt. Release and renewal match the holder's token
            // as a prefix (as they match it before a wake mark), the
            // give-back of a failed attempt only its own value: a give-back
            // that reaches a node late (queued on a connection that was
            // replaced, a node that was stalled) cannot delete a later
            // attempt's grant of the same holder.
            let attempt = format!("{}|q{}", request.token, attempt_mark());
            // A waiter queues on every node (`join`), so that the release
            // on any node can wake it, and also retries after a random
            // pause. Waiters are not served in queue order (no `fair`: the
            // nodes' queues need not agree, and waiting for each node's
            // head could leave nobody a majority); only a client that just
            // woke a waiter lets queued waiters go first, on its first
            // attempt (`respect`), so that it does not snatch the lock back.
            // Waiters themselves never defer, so someone always proceeds.
            let node_request = AcquireRequest {
                token: &attempt,
                ..request
            };
            // No node is waited for past the caller's wait (a stopped node
            // must not make a waiter overrun it); a few ms at least, so that
            // the last attempt of a wait can still be answered.
            let full = node_timeout(request.ttl_ms, self.deadline);
            let timeout = request.deadline.map_or(full, |deadline| {
                full.min(
                    deadline
                        .saturating_duration_since(started)
                        .max(LAST_ATTEMPT_TIMEOUT),
                )
            });
            let cut_short = timeout < full;
            // Settled as soon as a majority granted it, or can no longer.
            let mut pending: FuturesUnordered<_> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, node)| async move {
                    let answer = tokio::time::timeout(timeout, node.acquire(node_request))
                        .await
                        .ok();
                    (i, answer)
                })
                .collect();
            let (quorum, nodes) = (self.quorum(), self.nodes.len());
            let (mut granted, mut refused, mut answered) = (0, 0, 0);
            let mut busy = false;
            let mut fence: Option<u64> = None;
            let mut error = None;
            let mut failed = Vec::new();
            let mut granting = vec![false; nodes];
            while let Some((node, answer)) = pending.next().await {
                if matches!(answer, Some(Ok(_))) {
                    answered += 1;
                } else {
                    failed.push(node);
                }
                match answer {
                    Some(Ok(Acquire::Acquired {
                        fence: node_fence, ..
                    })) => {
                        granting[node] = true;
                        granted += 1;
                        fence = fence.max(node_fence);
                    }
                    Some(Ok(Acquire::Busy { .. })) => {
                        busy = true;
                        refused += 1;
                    }
                    Some(Err(node_error)) => {
                        error = Some(node_error);
                        refused += 1;
                    }
                    // No answer in time: its outcome unknown.
                    None => refused += 1,
                }
                if granted >= quorum || refused > nodes - quorum {
                    break;
                }
            }
            if granted >= quorum && !pending.is_empty() {
                // Held: the other nodes get a short grace to answer too
                // (about as long again as the majority took), so that a
                // healthy node is not left out of the hold (it would
                // tolerate one failure less); a stopped one is not waited
                // for. A request dropped unanswered may still land: it
                // holds the same token, which the release matches.
                let grace = (started.elapsed() * 2)
                    .max(Duration::from_millis(2))
                    .min(timeout);
                let _ = tokio::time::timeout(grace, async {
                    while let Some((node, answer)) = pending.next().await {
                        match answer {
                            Some(Ok(Acquire::Acquired {
                                fence: node_fence, ..
                            })) => {
                                granting[node] = true;
                                fence = fence.max(node_fence);
                            }
                            _ => failed.push(node),
                        }
                    }
                })
                .await;
            }
            drop(pending);
            let ttl = Duration::from_millis(request.ttl_ms);
            let valid = |started: Instant| started.elapsed() + drift(request.ttl_ms) < ttl;
            if granted >= self.quorum() && valid(started) {
                for &node in &failed {
                    self.node_failed(node, "lock acquisition");
                }
                self.leave_elsewhere(&request, &granting);
                let Some(token) = fence else {
                    return Ok(Acquire::Acquired {
                        fence: None,
                        found: None,
                    });
                };
                // The write-back: a majority must have the token before it
                // is handed out; every node that answers gets it.
                let retention_ms = request.fence_retention_ms.unwrap_or(request.ttl_ms);
                let raised = self
                    .write_back(request.keys, token, retention_ms, timeout)
                    .await;
                if raised >= self.quorum() && valid(started) {
                    return Ok(Acquire::Acquired {
                        fence: Some(token),
                        found: None,
                    });
                }
            }
            // Not held: given back everywhere, the nodes that did not
            // answer included, in the background (a stopped node runs it
            // when it resumes, after the attempt it follows on the same
            // connection; the next attempt writes another value).
            self.give_back(request.keys, attempt);
            // Nodes cut off by the end of the wait, and no node failing:
            // not acquired within the wait, as a busy lock is.
            if busy || (cut_short && error.is_none() && granted < quorum) {
                // A client that just woke a waiter (`respect`) gives it time
                // to take the lock before trying again without deferring.
                let pause = if request.respect {
                    WOKEN_WAITER_HEAD_START + jitter()
                } else {
                    jitter()
                };
                return Ok(Acquire::Busy {
                    expires_in: Some(pause),
                });
            }
            if granted >= quorum {
                // A majority granted it, but too late to hold it.
                return Err(not_held_in_time(
                    request.keys,
                    started.elapsed(),
                    request.ttl_ms,
                ));
            }
            // No node answered busy: the ones that answered granted it.
            Err(error.unwrap_or_else(|| no_majority(request.keys, "acquire", answered, quorum)))
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
            let waking = kind == Kind::Exclusive && keep_ms == 0;
            let shared = Arc::new((keys.clone(), token.to_owned()));
            let deadline = self.deadline;
            let mut releases: FuturesUnordered<_> = (0..self.nodes.len())
                .map(|i| {
                    let (nodes, shared) = (Arc::clone(&self.nodes), Arc::clone(&shared));
                    async move {
                        let (node, (keys, token)) = (&nodes[i], &*shared);
                        let release = async {
                            if waking {
                                node.release_waking(keys, token).await
                            } else {
                                node.release(kind, keys, token, keep_ms).await
                            }
                        };
                        (i, tokio::time::timeout(deadline, release).await.ok())
                    }
                })
                .collect();
            let (quorum, nodes) = (self.quorum(), self.nodes.len());
            let (mut mine, mut not, mut other) = (0, 0, false);
            let (mut retried, mut woke) = (false, false);
            let mut failed = Vec::new();
            while let Some((node, answer)) = releases.next().await {
                let Some(Ok(release)) = answer else {
                    failed.push(node);
                    continue;
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
            if carried && !releases.is_empty() {
                // The other nodes get a short grace (most answer within
                // moments of the majority); a stopped one is left to a
                // background task, which logs it if it fails.
                let grace = (sent_at.elapsed() * 2)
                    .max(Duration::from_millis(2))
                    .min(deadline);
                let _ = tokio::time::timeout(grace, async {
                    while let Some(answer) = releases.next().await {
                        if answer.1.as_ref().is_some_and(Result::is_ok) {
                            continue;
                        }
                        failed.push(answer.0);
                    }
                })
                .await;
                if !releases.is_empty() {
                    let warnings = Arc::clone(&self.warnings);
                    tokio::spawn(async move {
                        while let Some((node, answer)) = releases.next().await {
                            if !matches!(answer, Some(Ok(_))) {
                                warnings.failed(node, "release");
                            }
                        }
                    });
                }
            }
            if carried {
                for &node in &failed {
                    self.node_failed(node, "release");
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
                return Err(no_majority(keys, "release", mine + not, quorum));
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
        // Out of the queue on every node that answers; a node that does not
        // drops the place when its refresh deadline passes.
        Box::pin(async move {
            self.on_all(self.deadline, |node| node.leave(kind, keys, member))
                .await;
            Ok(())
        })
    }

    fn pass<'a>(
        &'a self,
        keys: &'a LockKeys,
        _token: &'a str,
        _next: &'a str,
        _ttl_ms: u64,
        _fence_retention_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Pass, LockError>> {
        // Never asked: `passes_in_process` is false.
        Box::pin(async move {
            Err(ConfigError::Unsupported {
                name: keys.name().to_owned(),
                reason: "no in-process hand-off over a quorum",
            }
            .into())
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
                        tokio::time::timeout(self.deadline, node.renew(items, round_trips))
                            .await
                            .ok()
                            .and_then(Result::ok);
                    (i, answer)
                })
                .collect();
            let (quorum, nodes) = (self.quorum(), self.nodes.len());
            // Per lock: nodes that extended it, nodes that answered it was
            // not there (or another's); and the nodes yet to answer.
            let mut mine = vec![0usize; items.len()];
            let mut not = vec![0usize; items.len()];
            let mut other = vec![false; items.len()];
            let mut silent = nodes;
            while let Some((node, answer)) = pending.next().await {
                silent -= 1;
                if answer.is_none() {
                    self.node_failed(node, "renewal");
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
        false
    }

    fn scan<'a>(
        &'a self,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<String>>, LockError>> {
        // Every node on its own (each is a whole keyspace); all must answer.
        Box::pin(async move {
            join_all(self.nodes.iter().map(|node| node.scan_keys(pattern, count)))
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
            join_all(self.nodes.iter().map(|node| node.snapshot(name, keys)))
                .await
                .into_iter()
                .collect()
        })
    }
}
