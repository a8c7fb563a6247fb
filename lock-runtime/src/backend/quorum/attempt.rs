//! One attempt to take a lock over a quorum: every node asked at once, the
//! answers counted as they come, settled as soon as they decide it.
//!
//! - **Held** when at least N/2+1 nodes granted it with validity left
//!   (ttl − elapsed − drift, from this attempt's start).
//! - **Not held**: given back on every node that granted it or whose answer
//!   is unknown, in the background (the nodes that refused hold nothing of
//!   it). Nodes that have not answered when the attempt settles are not
//!   waited for: their calls go on in the background, and a late grant is
//!   given back as soon as it comes.
//! - **Held, and the rest heard out in the background**: the caller does
//!   not wait for the nodes yet to answer (a fenced attempt gives them a
//!   short grace, for the largest token); their calls go on, but send
//!   nothing more (`Ballot::settled`), so that the calls that follow the
//!   hold on a node come after all of the attempt's.
//! - **No waiting on a dead node**: a node that did not answer its last
//!   call is waited for only briefly (10 ms or so; 100 ms before this client
//!   heard from it at all) when it alone could still decide the attempt, so
//!   a stopped or killed minority costs an attempt a few milliseconds, not
//!   the per-node timeout.
//! - **Busy or unreachable**: `Busy` only when a majority answered; fewer
//!   answers are an error naming the nodes that did not answer.
//!
//! Liveness under contention comes from the line of waiters
//! (`tickets.lua`): every node orders its waiters by the ticket each sends
//! unchanged to all of them, so every node defers to the same first waiter
//! and split votes between waiters do not repeat (design §13).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::nodes::{answered, Nodes, Silence};
use super::{slots, QuorumBackend};
use crate::backend::redis_backend::{Ballot, Vote, VoteKind};
use crate::backend::{Acquire, AcquireRequest, Kind, Respect, WaitPlace};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::token::Random;

/// The shortest ttl over a quorum: shorter, the drift allowance (1 % + 2 ms)
/// and a round trip leave no validity.
const MIN_QUORUM_TTL_MS: u64 = 10;

/// How long each node may take to answer an attempt made at (or after) the
/// end of a wait.
const LAST_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(5);

/// How long nodes that did not answer their last call are waited for, at
/// least (and at least twice as long as the attempt took so far), when only
/// they could still make a majority.
const DOWN_NODE_PATIENCE: Duration = Duration::from_millis(10);

/// The same for nodes this client has not heard from yet (they may still be
/// connecting: at least four times as long as the attempt took so far).
const NEW_NODE_PATIENCE: Duration = Duration::from_millis(100);

/// Failed attempts in a row after which a waiter leaves the line.
const FAILURES_BEFORE_STEPPING_OUT: u32 = 3;

/// How long after its per-node timeout a node still takes part in an
/// attempt (a call that arrives later is refused, nothing written): the
/// error of the client's reading of the node's clock, a round trip or so.
const LATE_MARGIN: Duration = Duration::from_millis(100);

/// The pause after the first split vote in a row (no holder, no majority):
/// a random pause up to it, doubled after each further one up to
/// [`SPLIT_VOTE_MAX_PAUSE`].
const SPLIT_VOTE_PAUSE: Duration = Duration::from_millis(2);
const SPLIT_VOTE_MAX_PAUSE: Duration = Duration::from_millis(100);

/// How long a waiter that is not first in line sleeps without a message
/// (the waiting loop refreshes its place sooner).
const NOT_FIRST_PAUSE: Duration = Duration::from_secs(1);

/// One node's call, in the background once the attempt has settled.
type NodeCall = BoxFuture<'static, (usize, Option<Result<Vote, LockError>>)>;

/// What each node said.
enum Said {
    /// Not yet answered.
    Open,
    /// Its answer, and its clock (µs) when it answered.
    Voted(VoteKind, u64),
    Silent(Silence),
}

impl QuorumBackend {
    pub(super) async fn attempt(&self, request: AcquireRequest<'_>) -> Result<Acquire, LockError> {
        check(&request)?;
        let started = Instant::now();
        let place = request.place;
        // A waiter out of line (its last attempt failed) does not join again
        // until an attempt is answered by a majority.
        let join =
            request.join && !place.is_some_and(|place| place.out_of_line.load(Ordering::Relaxed));
        let number = attempt_number(place);
        let value = match request.kind {
            Kind::Semaphore {
                capacity, permits, ..
            } => {
                let slots = slots::ask(place, capacity, permits, &self.random);
                format!("{}|q{number:08x}|s{slots}", request.token)
            }
            _ => format!("{}|q{number:08x}", request.token),
        };
        let ballot = Arc::new(Ballot {
            kind: request.kind,
            keys: request.keys.clone(),
            // The holder's token and the attempt's number: release and
            // renewal match the token as a prefix, the give-back of a
            // failed attempt only its own value, so a give-back that reaches
            // a node late cannot delete a later attempt's grant; and a node
            // lets a later attempt replace an earlier one's grant, never the
            // reverse (an earlier attempt's call may land late).
            value,
            member: request.member.to_owned(),
            ttl_ms: request.ttl_ms,
            fence_retention_ms: request.fence_retention_ms,
            waiter_timeout_ms: request.waiter_timeout_ms,
            join,
            // A try defers to the waiters in line, and so does a waiter,
            // unless its last attempt found it first in line on a majority:
            // the others defer to it then, and it takes a node whose first
            // waiter is gone or not yet in line elsewhere. The releaser's
            // next attempt defers to every waiter, a set's too (§4).
            respect: if request.respect == Respect::Everyone {
                Respect::Everyone
            } else if place.is_some_and(|place| place.first.load(Ordering::Relaxed)) {
                Respect::No
            } else {
                Respect::Singles
            },
            mine: request.mine,
            ticket: place.filter(|_| join).map_or(0, |place| self.ticket(place)),
            settled: std::sync::atomic::AtomicBool::new(false),
        });
        // Each node gets its own timeout (a tenth of the ttl, within the
        // call deadline), whatever the caller's wait. The end of the wait
        // (a few ms at least, so that the last attempt of a wait can still
        // be answered) cuts the attempt short only once a majority has
        // answered: with fewer answers nobody can tell whether the lock is
        // free, and an attempt that stopped there would report a lock held
        // ("busy") by nodes that may be stopped, for as long as they stay
        // so (no answer at the cut says nothing of a node's health). So an
        // attempt ends at most a per-node timeout after the end of the wait.
        // Never past the end the request sets (`AcquireRequest::until`: a
        // set's later key, taken within one call deadline of the set's
        // start; lock-sim quorum3 seed 144, a try of [a, c] that took 406
        // ms against 347, c's vote and write-back given whole timeouts
        // after a's had used most of the deadline).
        let timeout = match request.until {
            Some(until) => node_timeout(request.ttl_ms, self.deadline)
                .min(until.saturating_duration_since(started)),
            None => node_timeout(request.ttl_ms, self.deadline),
        };
        let cut_at = request.deadline.and_then(|deadline| {
            let at = deadline.max(started + LAST_ATTEMPT_TIMEOUT);
            (at < started + timeout).then_some(at)
        });
        let mut pending: FuturesUnordered<NodeCall> = (0..self.nodes.len())
            .map(|node| {
                let (nodes, ballot) = (Arc::clone(&self.nodes), Arc::clone(&ballot));
                // Refused by the node if it arrives when nobody waits for
                // its answer any more (its clock as last read; no limit
                // before any reading).
                let read = nodes[node].clock_at(started);
                let not_after = if read == 0 {
                    0
                } else {
                    read + (timeout + LATE_MARGIN).as_micros() as u64
                };
                // A try may be plain commands on a node that answered its
                // last call: they cannot refuse a late arrival
                // (`RedisBackend::plain_try`), and a node that is down
                // fails them as fast as the script.
                let plain = nodes[node].is_up();
                Box::pin(async move {
                    if let Some(refused) = nodes[node].refusing(ballot.keys.name(), "acquire") {
                        return (node, Some(Err(refused)));
                    }
                    let vote = nodes[node].redis.vote(&ballot, not_after, plain);
                    let answer = tokio::time::timeout(timeout, vote).await.ok();
                    if let Some(result) = &answer {
                        nodes[node].after(result);
                    }
                    (node, answer)
                }) as NodeCall
            })
            .collect();
        let mut said: Vec<Said> = (0..self.nodes.len()).map(|_| Said::Open).collect();
        let quorum = self.nodes.quorum();
        let granted = |said: &[Said]| {
            said.iter()
                .filter(|said| matches!(said, Said::Voted(VoteKind::Granted { .. }, _)))
                .count()
        };
        // Settled as soon as a majority granted it, or can no longer (and
        // a majority answered, or can no longer); the nodes that failed
        // their last call get only a short patience when they alone could
        // still make the majority.
        let mut cutoff: Option<Instant> = None;
        loop {
            let yes = granted(&said);
            if yes >= quorum {
                break;
            }
            // No longer grantable: settled once it is also known whether a
            // majority answered (busy) or can no longer answer (an error).
            // A node that fails at once (a refused connection) must not
            // turn a busy lock into "too few nodes answered" while the
            // others' answers are on their way.
            let voted = said
                .iter()
                .filter(|said| matches!(said, Said::Voted(..)))
                .count();
            if yes + pending.len() < quorum && (voted >= quorum || voted + pending.len() < quorum) {
                break;
            }
            // Armed once some node answered (a new client's first answers
            // come after its connections are made: the patience counts from
            // that) and every node still open failed its last call or has
            // not been heard from: only they could decide. Nodes that
            // answered their last call are waited for (their own timeout)
            // before that; were the cutoff armed while they were still
            // open, a new node's longer patience would also be given to the
            // nodes that failed, on every attempt they alone could decide
            // (with a minority stopped, about 100 ms between sections).
            if cutoff.is_none() && said.iter().any(|said| matches!(said, Said::Voted(..))) {
                let up = (0..said.len())
                    .filter(|&node| matches!(said[node], Said::Open) && self.nodes[node].is_up())
                    .count();
                if up == 0 {
                    // A node not heard from yet (a new client) may still be
                    // connecting: more patience than for one that failed.
                    let unknown = (0..said.len()).any(|node| {
                        matches!(said[node], Said::Open) && self.nodes[node].is_unknown()
                    });
                    let (factor, least) = if unknown {
                        (4, NEW_NODE_PATIENCE)
                    } else {
                        (2, DOWN_NODE_PATIENCE)
                    };
                    // Never past a node's own timeout (for a node not heard
                    // from yet, at least the new-node patience).
                    let patience = (started.elapsed() * factor).max(least);
                    cutoff = Some(Instant::now() + patience.min(timeout));
                }
            }
            // The end of the wait, if it comes first: settled there if a
            // majority answered.
            let answers = said
                .iter()
                .filter(|said| matches!(said, Said::Voted(..)))
                .count();
            let cut = cut_at.filter(|_| answers >= quorum);
            let until = match (cutoff, cut) {
                (Some(patience), Some(cut)) => Some(patience.min(cut)),
                (patience, cut) => patience.or(cut),
            };
            let next = match until {
                Some(at) => match tokio::time::timeout_at(at, pending.next()).await {
                    Ok(next) => next,
                    Err(_) if cut.is_some_and(|cut| Instant::now() >= cut) => break,
                    Err(_) => {
                        // Silent past the patience: not waited for again
                        // until it answers (its call goes on meanwhile).
                        for (node, said) in said.iter().enumerate() {
                            if matches!(said, Said::Open) {
                                self.nodes[node].saw(Some(false));
                            }
                        }
                        break;
                    }
                },
                None => pending.next().await,
            };
            let Some((node, answer)) = next else { break };
            said[node] = self.hear(node, answer, timeout);
        }
        // Nodes that failed their last call are not heard out: with a
        // minority stopped, every acquisition would leave a task waiting
        // for it.
        let worth_waiting = (0..said.len())
            .any(|node| matches!(said[node], Said::Open) && !self.nodes[node].is_down());
        let held = granted(&said) >= quorum && !pending.is_empty() && worth_waiting;
        // Heard out in the background only when each node yet to answer
        // answered its last call (its connection open: its call was sent
        // when the attempt started).
        let all_up = (0..said.len())
            .filter(|&node| matches!(said[node], Said::Open))
            .all(|node| self.nodes[node].is_up());
        if held && (request.fence_retention_ms.is_some() || !all_up) {
            // A short grace for the others to answer too (about as long
            // again as the majority took); a stopped one is not waited for.
            // Never past the nodes' own timeout. With a fencing token, so
            // that the token is the largest of as many nodes as answer in
            // time (a token written back to fewer nodes, or to nodes that
            // restarted empty since, is still exceeded; design §13). With a
            // node not heard from yet (a new client's first attempt, its
            // connections perhaps still opening), so that the call gets to
            // it and the node is not left out of the hold: a call heard out
            // in the background instead could be sent, once its connection
            // opened, after the hold's release, and take the lock there for
            // a hold that is over; dropped after the grace, a call not sent
            // yet never is, and one sent lands before the release, which
            // follows it on the same connection.
            let grace = (started.elapsed() * 2)
                .max(Duration::from_millis(2))
                .min(timeout.saturating_sub(started.elapsed()));
            let _ = tokio::time::timeout(grace, async {
                while let Some((node, answer)) = pending.next().await {
                    said[node] = self.hear(node, answer, timeout);
                }
            })
            .await;
            // Those still silent are not waited for by an attempt they
            // alone could decide, until they answer again.
            for (node, said) in said.iter().enumerate() {
                if matches!(said, Said::Open) {
                    self.nodes[node].saw(Some(false));
                }
            }
        } else if held {
            // Held, every node yet to answer up: they are heard out in the
            // background, within their timeout, for their health; the
            // caller does not wait for them. Their calls go on, so a
            // healthy node is not left out of the hold (a grant that lands
            // there holds the same value, which the release matches), but
            // send nothing more (`Ballot::settled`). (A grace here, a timer
            // earlier than any the runtime sleeps until, cost every
            // acquisition a wake-up of the I/O driver: issue 40.)
            let open: Vec<usize> = (0..said.len())
                .filter(|&node| matches!(said[node], Said::Open))
                .collect();
            ballot.settled.store(true, Ordering::Release);
            self.hear_out_in_background(std::mem::take(&mut pending), open, started + timeout);
        }
        if let Some(error) = config_error(&mut said) {
            // A node refused the semaphore's capacity: the caller's error,
            // not the nodes' (any grant elsewhere is given back).
            self.give_back_everywhere(&ballot);
            self.finish_in_background(pending, Arc::clone(&ballot), timeout);
            return Err(error);
        }
        self.clock.read(started, &said);
        let ttl = Duration::from_millis(request.ttl_ms);
        let valid = || started.elapsed() + drift(request.ttl_ms) < ttl;
        if granted(&said) >= quorum && valid() {
            for (node, said) in said.iter().enumerate() {
                if matches!(said, Said::Silent(_)) {
                    self.nodes.failed(node, "lock acquisition");
                }
            }
            // A set's waiter (its entry ends in `*`) stays in line until it
            // holds every key of the set (`lease/set_by_key.rs` leaves then).
            if !ballot.member.ends_with('*') {
                self.leave_line(&ballot);
            }
            let fence = said
                .iter()
                .filter_map(|said| match said {
                    Said::Voted(VoteKind::Granted { fence }, _) => *fence,
                    _ => None,
                })
                .max();
            // The nodes yet to answer are not heard out: a call still
            // waiting for its connection is dropped unsent, and one already
            // sent lands before the release, which follows it on the same
            // connection.
            drop(pending);
            let Some(token) = fence else {
                return Ok(Acquire::Acquired {
                    fence: None,
                    found: None,
                    holds: Some(ballot.value.clone()),
                });
            };
            // The write-back: a majority must have the token before it is
            // handed out; every node that answers gets it.
            let retention_ms = request.fence_retention_ms.unwrap_or(request.ttl_ms);
            // Within the call's deadline, counted from this attempt's start.
            let left = self.deadline.saturating_sub(started.elapsed());
            let left = request.until.map_or(left, |until| {
                left.min(until.saturating_duration_since(Instant::now()))
            });
            let raised = self
                .write_back(request.keys, token, retention_ms, timeout.min(left))
                .await;
            if raised >= quorum && valid() {
                return Ok(Acquire::Acquired {
                    fence: Some(token),
                    found: None,
                    holds: Some(ballot.value.clone()),
                });
            }
            // Not held after all: given back everywhere (every node may
            // hold it now).
            self.give_back_everywhere(&ballot);
            self.step_out_of_line(place, &ballot);
            let fence_short = (raised < quorum).then_some((raised, quorum));
            return Err(not_held_in_time(
                request.keys,
                started.elapsed(),
                request.ttl_ms,
                fence_short,
            ));
        }
        // Not held: given back on the nodes that granted it or whose answer
        // is unknown, in the background; the nodes yet to answer are heard
        // out there, and given back to if they grant it.
        self.give_back(&ballot, &said);
        self.finish_in_background(pending, Arc::clone(&ballot), timeout);
        if granted(&said) >= quorum {
            // A majority granted it, but too late to hold it.
            self.step_out_of_line(place, &ballot);
            return Err(not_held_in_time(
                request.keys,
                started.elapsed(),
                request.ttl_ms,
                None,
            ));
        }
        let answers = said
            .iter()
            .filter(|said| matches!(said, Said::Voted(..)))
            .count();
        // Busy only when a majority answered (an attempt is cut short by
        // the end of the wait only then).
        if answers >= quorum {
            if let Some(place) = place.filter(|_| request.join) {
                place.out_of_line.store(false, Ordering::Relaxed);
                place.failures.store(0, Ordering::Relaxed);
                if join {
                    learn(place, &said, quorum);
                }
            }
            if let (
                Some(place),
                Kind::Semaphore {
                    capacity, permits, ..
                },
            ) = (place, request.kind)
            {
                slots::learn(
                    place,
                    &said_taken(&said),
                    said.len(),
                    quorum,
                    capacity,
                    permits,
                    &self.random,
                );
            }
            let pause = pause(place, &said, &self.random);
            tracing::trace!(
                lock = request.keys.name(),
                granted = granted(&said),
                answers,
                ?pause,
                "quorum attempt refused"
            );
            return Ok(Acquire::Busy {
                expires_in: Some(pause),
            });
        }
        // Too few nodes answered to tell whether the lock is free.
        self.step_out_of_line(place, &ballot);
        let silent: Vec<(usize, Silence)> = said
            .into_iter()
            .enumerate()
            .filter_map(|(node, said)| match said {
                Said::Voted(..) => None,
                Said::Silent(silence) => Some((node, silence)),
                Said::Open => Some((node, Silence::NoAnswer(started.elapsed()))),
            })
            .collect();
        Err(unreachable(
            &self.nodes,
            request.keys,
            "acquire",
            answers,
            silent,
        ))
    }

    /// After attempts that failed several times in a row (too few nodes
    /// answered, or a majority granted too late: one slow round is not
    /// enough), a waiter leaves the line on every node and stays out until
    /// an attempt is answered by a majority: a waiter that cannot
    /// complete an attempt (its side of a partition, a ttl too short for its
    /// round trips) must not stand first in line and hold the others back
    /// for its whole wait. It keeps its ticket, and so its place, for when it
    /// joins again.
    fn step_out_of_line(&self, place: Option<&WaitPlace>, ballot: &Arc<Ballot>) {
        let Some(place) = place else { return };
        let failures = place.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if ballot.join && failures >= FAILURES_BEFORE_STEPPING_OUT {
            self.leave_line(ballot);
            place.out_of_line.store(true, Ordering::Relaxed);
        }
    }

    /// A waiter's ticket, its place in line on every node: taken once, at
    /// its first attempt in line, from the quorum's time (the nodes' clocks,
    /// as its last attempt read them, moved on by this process's monotonic
    /// clock), so that every node orders it among the other waiters alike
    /// from the start. 0 before any node answered this client: each node then
    /// uses its own clock, and the waiter keeps the median of them (`learn`).
    fn ticket(&self, place: &WaitPlace) -> u64 {
        let ticket = place.ticket.load(Ordering::Relaxed);
        if ticket != 0 {
            return ticket;
        }
        let Some(now) = self.clock.now_us() else {
            return 0;
        };
        place.ticket.store(now, Ordering::Relaxed);
        now
    }

    /// Notes one node's answer (and its health).
    fn hear(
        &self,
        node: usize,
        answer: Option<Result<Vote, LockError>>,
        timeout: Duration,
    ) -> Said {
        let node_ref = &self.nodes[node];
        match answer {
            Some(result) => {
                node_ref.saw(Some(answered(&result)));
                match result {
                    Ok(Vote {
                        kind: VoteKind::TooLate,
                        clock_us,
                    }) => {
                        node_ref.read_clock(clock_us);
                        Said::Silent(Silence::NoAnswer(timeout))
                    }
                    Ok(Vote { kind, clock_us }) => {
                        node_ref.read_clock(clock_us);
                        Said::Voted(kind, clock_us)
                    }
                    Err(error) => Said::Silent(Silence::Failed(error)),
                }
            }
            None => {
                // No answer within its own timeout.
                node_ref.saw(Some(false));
                Said::Silent(Silence::NoAnswer(timeout))
            }
        }
    }

    /// The calls still open when an attempt held, heard out in the
    /// background until `until`: each answer notes its node's health, and a
    /// node still silent then is not waited for by an attempt it alone could
    /// decide, until it answers again.
    fn hear_out_in_background(
        &self,
        mut pending: FuturesUnordered<NodeCall>,
        mut open: Vec<usize>,
        until: Instant,
    ) {
        let nodes = Arc::clone(&self.nodes);
        tokio::spawn(async move {
            let _ = tokio::time::timeout_at(until, async {
                while let Some((node, answer)) = pending.next().await {
                    open.retain(|&open| open != node);
                    if let Some(Ok(vote)) = &answer {
                        nodes[node].read_clock(vote.clock_us);
                    }
                    nodes[node].saw(Some(answer.as_ref().is_some_and(answered)));
                }
            })
            .await;
            for node in open {
                nodes[node].saw(Some(false));
            }
        });
    }

    /// The calls still open when an attempt that did not hold settled,
    /// heard out in the background (each within its timeout): each answer
    /// notes the node's health, and the attempt is given back on each node
    /// that grants it late or does not answer (a give-back sent before the
    /// answer could overtake a call still waiting for its connection).
    fn finish_in_background(
        &self,
        mut pending: FuturesUnordered<NodeCall>,
        ballot: Arc<Ballot>,
        timeout: Duration,
    ) {
        if pending.is_empty() {
            return;
        }
        let nodes = Arc::clone(&self.nodes);
        tokio::spawn(async move {
            while let Some((node, answer)) = pending.next().await {
                let node_ref = &nodes[node];
                // Refused, or too late: nothing written.
                let refused = matches!(
                    answer,
                    Some(Ok(Vote {
                        kind: VoteKind::Refused { .. } | VoteKind::TooLate,
                        ..
                    }))
                );
                if let Some(Ok(vote)) = &answer {
                    node_ref.read_clock(vote.clock_us);
                }
                match &answer {
                    Some(result) => node_ref.saw(Some(answered(result))),
                    None => node_ref.saw(Some(false)),
                }
                if !refused {
                    let _ = tokio::time::timeout(
                        timeout.max(DOWN_NODE_PATIENCE),
                        node_ref.redis.release_waking(
                            ballot.kind,
                            &ballot.keys,
                            &ballot.value,
                            &ballot.member,
                        ),
                    )
                    .await;
                }
            }
        });
    }

    /// Gives the attempt back on the nodes that granted it or failed (their
    /// outcome unknown), in the background; a give-back wakes the first
    /// waiter in line on its node.
    fn give_back(&self, ballot: &Arc<Ballot>, said: &[Said]) {
        let owed: Vec<usize> = (0..said.len())
            .filter(|&node| {
                matches!(
                    said[node],
                    Said::Voted(VoteKind::Granted { .. }, _) | Said::Silent(_)
                )
            })
            .collect();
        if owed.is_empty() {
            return;
        }
        let (nodes, ballot) = (Arc::clone(&self.nodes), Arc::clone(ballot));
        tokio::spawn(async move {
            futures_util::future::join_all(owed.iter().map(|&node| {
                nodes[node].redis.release_waking(
                    ballot.kind,
                    &ballot.keys,
                    &ballot.value,
                    &ballot.member,
                )
            }))
            .await;
        });
    }

    /// Gives the attempt back on every node, in the background.
    fn give_back_everywhere(&self, ballot: &Arc<Ballot>) {
        let (nodes, ballot) = (Arc::clone(&self.nodes), Arc::clone(ballot));
        tokio::spawn(async move {
            futures_util::future::join_all(nodes.iter().map(|node| {
                node.redis
                    .release_waking(ballot.kind, &ballot.keys, &ballot.value, &ballot.member)
            }))
            .await;
        });
    }

    /// A waiter that won on a majority leaves the line on every node (in
    /// the background; on each node before its release, which follows on
    /// the same connection), so that releases wake the next waiter, not one
    /// that holds the lock.
    fn leave_line(&self, ballot: &Arc<Ballot>) {
        if !ballot.join {
            return;
        }
        let (nodes, ballot) = (Arc::clone(&self.nodes), Arc::clone(ballot));
        tokio::spawn(async move {
            futures_util::future::join_all(nodes.iter().map(|node| {
                node.redis
                    .leave_line(ballot.kind, &ballot.keys, &ballot.member)
            }))
            .await;
        });
    }
}

/// What a waiter learns from an attempt that did not hold: its ticket (the
/// first time it is put in line: the median of the nodes' clocks, which it
/// sends unchanged from then on), and whether it is first in line on a
/// majority (its next attempt then takes a free node whatever that node's
/// own first waiter).
fn learn(place: &WaitPlace, said: &[Said], quorum: usize) {
    let refused = || {
        said.iter().filter_map(|said| match said {
            Said::Voted(VoteKind::Refused { ticket, first, .. }, _) => Some((*ticket, *first)),
            _ => None,
        })
    };
    if place.ticket.load(Ordering::Relaxed) == 0 {
        let mut tickets: Vec<u64> = refused()
            .map(|(ticket, _)| ticket)
            .filter(|&ticket| ticket > 0)
            .collect();
        tickets.sort_unstable();
        if let Some(&median) = tickets.get(tickets.len().saturating_sub(1) / 2) {
            place.ticket.store(median, Ordering::Relaxed);
        }
    }
    let granted = said
        .iter()
        .filter(|said| matches!(said, Said::Voted(VoteKind::Granted { .. }, _)))
        .count();
    let first = granted + refused().filter(|&(_, first)| first).count();
    // First on a majority of the nodes that answered (and so, with a
    // majority answering, on more nodes than any other waiter can be).
    let voted = granted + refused().count();
    place
        .first
        .store(voted >= quorum && first * 2 > voted, Ordering::Relaxed);
}

/// The quorum's time (µs), as the nodes' clocks give it: the median of the
/// clocks of the nodes that answered an attempt, and when that attempt
/// started on this process's monotonic clock.
#[derive(Default)]
pub(super) struct QuorumClock(std::sync::Mutex<Option<(Instant, u64)>>);

impl QuorumClock {
    /// Reads the nodes' clocks from the answers of an attempt started at
    /// `started`.
    fn read(&self, started: Instant, said: &[Said]) {
        let mut clocks: Vec<u64> = said
            .iter()
            .filter_map(|said| match said {
                Said::Voted(_, clock) if *clock > 0 => Some(*clock),
                _ => None,
            })
            .collect();
        // A majority of the nodes' clocks, so that one node's clock far off
        // cannot move every ticket of this client.
        if clocks.len() < said.len() / 2 + 1 {
            return;
        }
        clocks.sort_unstable();
        let median = clocks[(clocks.len() - 1) / 2];
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((started, median));
    }

    /// The quorum's time now, if any node has answered.
    fn now_us(&self) -> Option<u64> {
        let read = *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        read.map(|(at, clock)| clock + at.elapsed().as_micros() as u64)
    }
}

/// How long a waiter pauses after a busy attempt (it is woken sooner by a
/// release's message): until the first node's holder expires; after a split
/// vote (nobody holds it, yet it got no majority while first in line
/// somewhere), a short random pause that grows with each split vote in a
/// row; not first anywhere, until the first waiter's release wakes it.
fn pause(place: Option<&WaitPlace>, said: &[Said], random: &Random) -> Duration {
    let held = said
        .iter()
        .filter_map(|said| match said {
            Said::Voted(VoteKind::Refused { held_for, .. }, _) => *held_for,
            _ => None,
        })
        .min();
    let first = said.iter().any(|said| {
        matches!(
            said,
            Said::Voted(
                VoteKind::Granted { .. } | VoteKind::Refused { first: true, .. },
                _
            )
        )
    });
    let Some(place) = place else {
        return held.unwrap_or(NOT_FIRST_PAUSE);
    };
    if held.is_some() || !first {
        place.split_votes.store(0, Ordering::Relaxed);
        return held.unwrap_or(NOT_FIRST_PAUSE);
    }
    let splits = place.split_votes.fetch_add(1, Ordering::Relaxed).min(16);
    let most = SPLIT_VOTE_PAUSE
        .saturating_mul(1 << splits)
        .min(SPLIT_VOTE_MAX_PAUSE);
    Duration::from_millis(1) + random_below(most, random)
}

/// The checks made before anything is sent.
fn check(request: &AcquireRequest<'_>) -> Result<(), LockError> {
    if request.fair {
        return Err(ConfigError::Unsupported {
            name: request.keys.name().to_owned(),
            reason: "`fair` is not available over a quorum (RedLock): waiters there are served \
                     in the order of their tickets, which the nodes' clocks give and a failed \
                     node can reorder, so the strict order `fair` promises cannot be kept; \
                     drop `fair`",
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
    Ok(())
}

/// How long one node may take to answer an acquisition: a small fraction
/// of the ttl (a slow node must not eat the validity), within the call
/// deadline.
pub(super) fn node_timeout(ttl_ms: u64, deadline: Duration) -> Duration {
    Duration::from_millis(ttl_ms / 10)
        .clamp(Duration::from_millis(5), Duration::from_millis(500))
        .min(deadline)
}

/// The time a lock's validity is cut by for clock drift between the
/// client and the nodes: 1 % of the ttl + 2 ms (seed 003).
fn drift(ttl_ms: u64) -> Duration {
    Duration::from_millis(ttl_ms / 100 + 2)
}

/// The number of this attempt of a waiter (from 1), 0 for a try (its token
/// makes one attempt).
fn attempt_number(place: Option<&WaitPlace>) -> u32 {
    place.map_or(0, |place| {
        place
            .attempts
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
    })
}

/// A random duration below `most` (at µs resolution).
fn random_below(most: Duration, random: &Random) -> Duration {
    let micros = most.as_micros().max(1) as u64;
    Duration::from_micros(random.below(micros))
}

/// The error of an attempt that a majority granted but that was not held:
/// its validity ran out first (the nodes answered too slowly for the ttl),
/// or its fencing write-back reached only `fence_short.0` of the
/// `fence_short.1` nodes needed in time. Given back.
fn not_held_in_time(
    keys: &LockKeys,
    elapsed: Duration,
    ttl_ms: u64,
    fence_short: Option<(usize, usize)>,
) -> LockError {
    let text = match fence_short {
        Some((raised, needed)) => format!(
            "a majority granted the lock, but its fencing token reached only {raised} of the \
             {needed} nodes needed within {}; it was given back: check the nodes that \
             did not answer, or give a longer ttl (each node's timeout is a tenth of it)",
            crate::error::Readable(elapsed)
        ),
        None => format!(
            "a majority granted the lock, but after {} of its {ttl_ms} ms ttl no \
             validity was left; it was given back: give a longer ttl, or check the nodes' \
             latency",
            crate::error::Readable(elapsed)
        ),
    };
    LockError::redis(
        keys.name(),
        "acquire",
        std::io::Error::new(std::io::ErrorKind::TimedOut, text).into(),
    )
}

/// The error of a call that too few nodes answered to decide: how many
/// answered, and which did not and why.
pub(super) fn unreachable(
    nodes: &Nodes,
    keys: &LockKeys,
    operation: &'static str,
    answers: usize,
    silent: Vec<(usize, Silence)>,
) -> LockError {
    let kind = if !silent.is_empty() && silent.iter().all(|(_, silence)| silence.is_refusal()) {
        std::io::ErrorKind::ConnectionRefused
    } else {
        std::io::ErrorKind::TimedOut
    };
    let which: Vec<String> = silent
        .iter()
        .map(|(node, silence)| format!("{}: {silence}", nodes[*node].label))
        .collect();
    let text = format!(
        "no majority of the quorum answered: {answers} of {} nodes did, {} are needed (not \
         answering: {})",
        nodes.len(),
        nodes.quorum(),
        which.join("; ")
    );
    // Nodes that refused the call (a permission, a script error) answer
    // the same way every time: when they alone keep a majority away, the
    // error is theirs, of their kind (so its advice and retries follow it).
    let refusals: Vec<&redis::RedisError> = silent
        .iter()
        .filter_map(|(_, silence)| match silence {
            Silence::Failed(LockError::Redis { source, .. })
                if crate::backend::is_refusal(source) =>
            {
                Some(source)
            }
            _ => None,
        })
        .collect();
    if refusals.len() > nodes.len() - nodes.quorum() {
        let kind = refusals
            .iter()
            .map(|refusal| refusal.kind())
            .find(|kind| *kind == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm))
            .unwrap_or(redis::ErrorKind::Server(
                redis::ServerErrorKind::ResponseError,
            ));
        return LockError::redis(
            keys.name(),
            operation,
            (kind, "too many nodes of the quorum refused the call", text).into(),
        );
    }
    LockError::redis(
        keys.name(),
        operation,
        std::io::Error::new(kind, text).into(),
    )
}

/// The error of a release whose answers do not decide it: a majority
/// answered, but split between nodes that still held the lock and nodes
/// that no longer did, and the silent ones could tip it either way.
pub(super) fn undecided(
    nodes: &Nodes,
    keys: &LockKeys,
    held: usize,
    not_held: usize,
    silent: Vec<(usize, Silence)>,
) -> LockError {
    let which: Vec<String> = silent
        .iter()
        .map(|(node, silence)| format!("{}: {silence}", nodes[*node].label))
        .collect();
    LockError::redis(
        keys.name(),
        "release",
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the nodes' answers do not decide it: {held} still held the lock, {not_held} no \
                 longer did, {} did not answer ({}); {} agreeing make a majority",
                silent.len(),
                which.join("; "),
                nodes.quorum(),
            ),
        )
        .into(),
    )
}

/// Takes a node's refusal of the caller's options (a semaphore's capacity)
/// out of what the nodes said.
fn config_error(said: &mut [Said]) -> Option<LockError> {
    let at = said
        .iter()
        .position(|said| matches!(said, Said::Silent(Silence::Failed(LockError::Config(_)))))?;
    match std::mem::replace(&mut said[at], Said::Open) {
        Said::Silent(Silence::Failed(error)) => Some(error),
        _ => None,
    }
}

/// The slots each refusing node reported taken (a semaphore's).
fn said_taken(said: &[Said]) -> Vec<&[u32]> {
    said.iter()
        .filter_map(|said| match said {
            Said::Voted(
                VoteKind::Refused {
                    taken: Some(taken), ..
                },
                _,
            ) => Some(taken.as_slice()),
            _ => None,
        })
        .collect()
}
