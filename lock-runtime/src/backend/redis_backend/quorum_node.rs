//! The calls a quorum (RedLock, `quorum.rs`) makes on one of its nodes: one
//! node's part of an attempt (`quorum_acquire.lua`), the release or give-back
//! that wakes the first waiter in line there (`quorum_release.lua`), leaving
//! the line (`quorum_leave.lua`), an in-process hand-off's part
//! (`quorum_handoff.lua`) and the fencing write-back (`fence_raise.lua`).

use std::time::Duration;

use redis::aio::ConnectionLike;

use super::RedisBackend;
use crate::backend::scripts::{
    evalsha, run, LuaScript, Told, FENCE_RAISE, QUORUM_ACQUIRE, QUORUM_HANDOFF, QUORUM_LEAVE,
    QUORUM_RELEASE, QUORUM_RW_ACQUIRE, QUORUM_SEMAPHORE_ACQUIRE, QUORUM_SHARED_LEAVE,
    QUORUM_SHARED_RELEASE,
};
use crate::backend::{Found, Kind, Pass, Release, Respect};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;

/// One node's answer to its part of an attempt over a quorum, and the
/// node's clock (µs) when it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Vote {
    pub(crate) kind: VoteKind,
    pub(crate) clock_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VoteKind {
    /// Granted (or found granted to this attempt by an earlier try of the
    /// same call), with the node's fencing token when one was asked for.
    Granted { fence: Option<u64> },
    /// Not taken part: the call reached the node after its `not_after` (it
    /// waited in a connection, or behind a stopped node), when nobody waits
    /// for its answer any more; nothing was written.
    TooLate,
    /// Not granted.
    Refused {
        /// The holder's remaining ttl here; `None`: the lock is free here,
        /// but another waiter is first in line.
        held_for: Option<Duration>,
        /// The ticket the caller is in line with here (0: not in line).
        ticket: u64,
        /// The caller is first in line here.
        first: bool,
        /// A semaphore's slots held here by others.
        taken: Option<Vec<u32>>,
    },
}

/// What a node's refusal reports for a key it holds with no expiry: the
/// longest a waiter sleeps anyway (its place is refreshed sooner).
const NO_EXPIRY: Duration = Duration::from_secs(3600);

/// One attempt over a quorum, as each node is asked it: owned, so that the
/// calls to nodes that have not answered when the attempt settles can go on
/// in the background.
pub(crate) struct Ballot {
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
    /// The attempt's value, `<token>|q<attempt>` (a semaphore's:
    /// `<token>|q<attempt>|s<slot>,<slot>,...`, the slots it asks for).
    pub(crate) value: String,
    /// The caller's entry in the line (`<channel>|<token>`).
    pub(crate) member: String,
    pub(crate) ttl_ms: u64,
    pub(crate) fence_retention_ms: Option<u64>,
    pub(crate) waiter_timeout_ms: u64,
    /// Join (or refresh a place in) the line when not granted.
    pub(crate) join: bool,
    /// Whom in line it defers to (`Respect`; the shared kinds' scripts
    /// know only 0 and 1: every waiter in line).
    pub(crate) respect: Respect,
    /// An earlier try of this call got no answer.
    pub(crate) mine: bool,
    /// The caller's ticket (0: none yet; the node's clock is used).
    pub(crate) ticket: u64,
    /// The attempt held, and its caller went on without the nodes yet to
    /// answer: their calls are heard out in the background, but send
    /// nothing more (no script after a plain try that found waiters, no
    /// retry). The hold's release, pass or renewal that the caller sends
    /// next then reaches each node after all of the attempt's calls (one
    /// connection keeps their order); a call sent after it could take the
    /// lock on that node again for a hold that is over. Set by the task
    /// that polled the calls until then, before it hands them over.
    pub(crate) settled: std::sync::atomic::AtomicBool,
}

impl RedisBackend {
    /// One node's part of an attempt over a quorum (`quorum_acquire.lua`).
    /// `not_after_us`: the node refuses to take part past this time on its
    /// clock (0: no limit).
    ///
    /// `plain`: the node answered its last call:
    /// a try in the common case may then be plain commands (see
    /// [`plain_try`](Self::plain_try)).
    pub(crate) async fn vote(
        &self,
        ballot: &Ballot,
        not_after_us: u64,
        plain: bool,
    ) -> Result<Vote, LockError> {
        if plain
            && ballot.kind == Kind::Exclusive
            && !ballot.join
            && !ballot.mine
            && ballot.fence_retention_ms.is_none()
            && ballot.respect == Respect::Singles
        {
            if let Some(vote) = self.plain_try(ballot).await? {
                return Ok(vote);
            }
            if ballot.settled.load(std::sync::atomic::Ordering::Acquire) {
                // Held without this node: nothing more is sent.
                return Ok(Vote {
                    kind: VoteKind::TooLate,
                    clock_us: 0,
                });
            }
            // Waiters in line, or the try got no answer: the script,
            // recognising a lock the try may have taken (`mine`).
            return Box::pin(self.full_vote(ballot, not_after_us, true)).await;
        }
        Box::pin(self.full_vote(ballot, not_after_us, false)).await
    }

    /// One node's part of a try over a quorum in the common case (an
    /// exclusive lock, no fencing, no place in line, no attempt of unknown
    /// outcome before): `SET NX PX` and `EXISTS` of the line, in one round
    /// trip, without a script. A script costs Redis several times what
    /// these plain commands do (design §13, "What a try costs"). `None`:
    /// waiters are in line there (the key, if this `SET` took it, is given
    /// back first: a try defers to the first waiter), or the call got no
    /// answer (it may have landed: the caller asks again with `mine`). A
    /// refusal carries no expiry (a try does not sleep until one).
    ///
    /// Unlike `quorum_acquire.lua` it cannot refuse a call that arrives too
    /// late: the caller sends it only to a node that answered its last call.
    async fn plain_try(&self, ballot: &Ballot) -> Result<Option<Vote>, LockError> {
        let keys = &ballot.keys;
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("SET")
            .arg(&keys.lock)
            .arg(&ballot.value)
            .arg("NX")
            .arg("PX")
            .arg(ballot.ttl_ms);
        pipeline.cmd("EXISTS").arg(keys.tickets());
        let pipeline = &pipeline;
        let reply = self
            .call(
                keys.name(),
                "acquire",
                |mut connection, number| async move {
                    if number > 0 {
                        return Ok(None);
                    }
                    connection
                        .req_packed_commands(pipeline, 0, 2)
                        .await
                        .map(Some)
                },
            )
            .await?;
        let Some(mut reply) = reply else {
            return Ok(None);
        };
        // An error reply (a command the ACL refuses, say) is the call's
        // error, of its kind.
        let line = reply.pop().unwrap_or(redis::Value::Nil);
        let set = reply.pop().unwrap_or(redis::Value::Nil);
        let error = |value: redis::Value| match value.extract_error() {
            Err(error) => LockError::redis(keys.name(), "acquire", error),
            Ok(value) => unexpected(keys, &value),
        };
        let taken = match set {
            redis::Value::Okay => true,
            redis::Value::SimpleString(ok) if ok == "OK" => true,
            redis::Value::Nil => false,
            other => return Err(error(other)),
        };
        let line = match line {
            redis::Value::Int(count) => count > 0,
            other => {
                if taken {
                    let _ = self
                        .release_waking(Kind::Exclusive, keys, &ballot.value, "")
                        .await;
                }
                return Err(error(other));
            }
        };
        if line {
            if taken {
                self.release_waking(Kind::Exclusive, keys, &ballot.value, "")
                    .await?;
            }
            return Ok(None);
        }
        let kind = if taken {
            VoteKind::Granted { fence: None }
        } else {
            VoteKind::Refused {
                held_for: None,
                ticket: 0,
                first: false,
                taken: None,
            }
        };
        Ok(Some(Vote { kind, clock_us: 0 }))
    }

    /// [`vote`](Self::vote) by the kind's full acquire script.
    async fn full_vote(
        &self,
        ballot: &Ballot,
        not_after_us: u64,
        retried: bool,
    ) -> Result<Vote, LockError> {
        let keys = &ballot.keys;
        let retention_ms = ballot.fence_retention_ms.unwrap_or(0);
        let bytes = 5 * keys.lock.len() + 60 + ballot.value.len() + 80 + ballot.member.len();
        let script: &LuaScript = match ballot.kind {
            Kind::Exclusive => &QUORUM_ACQUIRE,
            Kind::Read | Kind::Write => &QUORUM_RW_ACQUIRE,
            Kind::Semaphore { .. } => &QUORUM_SEMAPHORE_ACQUIRE,
        };
        let key_count = if matches!(ballot.kind, Kind::Read | Kind::Write) {
            5
        } else {
            4
        };
        let mut cmd = evalsha(script, key_count, 16, bytes);
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters());
        if key_count == 5 {
            cmd.arg(keys.readers());
        }
        cmd.arg(&ballot.value)
            .arg(ballot.ttl_ms)
            .arg(retention_ms)
            .arg(ballot.waiter_timeout_ms)
            .arg(u8::from(ballot.join))
            .arg(match ballot.kind {
                Kind::Exclusive => ballot.respect.arg(),
                _ => u8::from(ballot.respect.any()),
            })
            .arg(&ballot.member);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        let reply = self
            .call(keys.name(), "acquire", |mut connection, number| {
                if number > 0 && ballot.settled.load(std::sync::atomic::Ordering::Acquire) {
                    // Held without this node: not sent again.
                    return futures_util::future::Either::Left(std::future::ready(Err(
                        redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "the attempt held without this node",
                        )),
                    )));
                }
                // A retry of this call recognises a lock its first try took.
                let mut cmd = cmd.clone();
                cmd.arg(u8::from(ballot.mine || number > 0 || retried))
                    .arg(ballot.ticket)
                    .arg(not_after_us);
                match ballot.kind {
                    Kind::Read => {
                        cmd.arg("r");
                    }
                    Kind::Write => {
                        cmd.arg("w");
                    }
                    Kind::Semaphore {
                        capacity, permits, ..
                    } => {
                        cmd.arg(permits).arg(capacity);
                    }
                    Kind::Exclusive => {}
                }
                futures_util::future::Either::Right(async move {
                    run::<Vec<redis::Value>>(script, &cmd, &mut connection, scripts).await
                })
            })
            .await?;
        let at = |i: usize| match reply.get(i) {
            Some(redis::Value::Int(value)) => *value,
            _ => -1,
        };
        let clock_us = at(reply.len().saturating_sub(1)).max(0) as u64;
        if let (
            -3 | -4,
            Kind::Semaphore {
                capacity, permits, ..
            },
        ) = (at(0), ballot.kind)
        {
            return Err(semaphore_refusal(keys, at(0), at(1), capacity, permits));
        }
        let kind = if at(0) == 1 {
            VoteKind::Granted {
                fence: ballot.fence_retention_ms.map(|_| at(1) as u64),
            }
        } else if at(1) == -3 {
            VoteKind::TooLate
        } else {
            VoteKind::Refused {
                // -2: free here (another is first in line); -1: a key with
                // no expiry (not one of ours): held, for as long as anyone
                // can tell.
                held_for: match at(1) {
                    -2 => None,
                    -1 => Some(NO_EXPIRY),
                    ms => Some(Duration::from_millis(ms.max(0) as u64)),
                },
                ticket: at(2).max(0) as u64,
                first: at(3) == 1,
                taken: match reply.get(4) {
                    Some(redis::Value::BulkString(taken)) if reply.len() > 5 => Some(
                        String::from_utf8_lossy(taken)
                            .split(',')
                            .filter_map(|slot| slot.parse().ok())
                            .collect(),
                    ),
                    _ => None,
                },
            }
        };
        Ok(Vote { kind, clock_us })
    }

    /// The release of an exclusive lock on one node of a quorum, or the
    /// give-back of a failed attempt (`quorum_release.lua`):
    /// compare-and-delete, then a wake-up for the first waiter in line
    /// (unless that is `own`, the giver's own entry).
    pub(crate) async fn release_waking(
        &self,
        kind: Kind,
        keys: &LockKeys,
        token: &str,
        own: &str,
    ) -> Result<Release, LockError> {
        let script: &LuaScript = if kind == Kind::Exclusive {
            &QUORUM_RELEASE
        } else {
            &QUORUM_SHARED_RELEASE
        };
        let shared = kind != Kind::Exclusive;
        let mut cmd = evalsha(
            script,
            4 + usize::from(shared),
            7,
            5 * keys.lock.len() + token.len() + own.len() + 48,
        );
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters());
        shared_tail(&mut cmd, kind, keys);
        cmd.arg(token).arg(own);
        if shared {
            cmd.arg(mode(kind));
        }
        self.release_call(keys.name(), script, &cmd).await
    }

    /// This node's part of an in-process hand-off over a quorum
    /// (`quorum_handoff.lua`): the lock goes from the value `token` to the
    /// value `next`, with `ttl_ms`.
    pub(crate) async fn pass_on_node(
        &self,
        keys: &LockKeys,
        token: &str,
        next: &str,
        ttl_ms: u64,
    ) -> Result<Pass, LockError> {
        let mut cmd = evalsha(
            &QUORUM_HANDOFF,
            2,
            3,
            2 * keys.lock.len() + token.len() + next.len() + 40,
        );
        cmd.arg(&keys.lock)
            .arg(keys.tickets())
            .arg(token)
            .arg(next)
            .arg(ttl_ms);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        let reply: Vec<i64> = self
            .call(keys.name(), "hand-off", |mut connection, _| async move {
                run(&QUORUM_HANDOFF, cmd, &mut connection, scripts).await
            })
            .await?;
        Ok(match reply.first() {
            Some(1) => Pass::Passed {
                fence: None,
                queued: reply.get(1) == Some(&1),
            },
            Some(0) => Pass::Refused(Found::Gone),
            _ => Pass::Refused(Found::Other),
        })
    }

    /// A waiter over a quorum leaves the line on this node
    /// (`quorum_leave.lua`).
    pub(crate) async fn leave_line(
        &self,
        kind: Kind,
        keys: &LockKeys,
        member: &str,
    ) -> Result<(), LockError> {
        let script: &LuaScript = if kind == Kind::Exclusive {
            &QUORUM_LEAVE
        } else {
            &QUORUM_SHARED_LEAVE
        };
        let mut cmd = evalsha(
            script,
            4 + usize::from(kind != Kind::Exclusive),
            6,
            5 * keys.lock.len() + member.len() + 40,
        );
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters());
        shared_tail(&mut cmd, kind, keys);
        cmd.arg(member);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(
            keys.name(),
            "leave the queue",
            |mut connection, _| async move {
                run::<Told>(script, cmd, &mut connection, scripts)
                    .await
                    .map(|told| self.told(told))
            },
        )
        .await
        .map(|_| ())
    }

    /// Makes the lock's last fencing token at least `token` (a quorum's
    /// write-back, `lua/fence_raise.lua`).
    pub(crate) async fn raise_fence(
        &self,
        keys: &LockKeys,
        token: u64,
        retention_ms: u64,
    ) -> Result<(), LockError> {
        let mut cmd = evalsha(&FENCE_RAISE, 1, 2, keys.lock.len() + 48);
        cmd.arg(keys.fence()).arg(token).arg(retention_ms);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(
            keys.name(),
            "fencing write-back",
            |mut connection, _| async move {
                run::<i64>(&FENCE_RAISE, cmd, &mut connection, scripts).await
            },
        )
        .await
        .map(|_| ())
    }
}

/// The error of a reply a plain try's `SET NX PX` never gets (an error
/// reply, say): an unknown outcome (the caller gives the attempt back).
fn unexpected(keys: &LockKeys, reply: &redis::Value) -> LockError {
    LockError::redis(
        keys.name(),
        "acquire",
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to SET NX PX",
            format!("{reply:?}"),
        )),
    )
}

/// A shared kind's fifth key: the readers of a read/write lock, or a
/// semaphore's permits again (its scripts read KEYS[5] only for readers).
fn shared_tail(cmd: &mut redis::Cmd, kind: Kind, keys: &LockKeys) {
    match kind {
        Kind::Exclusive => {}
        Kind::Read | Kind::Write => {
            cmd.arg(keys.readers());
        }
        Kind::Semaphore { .. } => {
            cmd.arg(&keys.lock);
        }
    }
}

/// What a shared kind's release removes: `w` the writer key, `r` a read
/// share, k a semaphore holder of k permits.
fn mode(kind: Kind) -> String {
    match kind {
        Kind::Write => "w".to_owned(),
        Kind::Semaphore { permits, .. } => permits.to_string(),
        _ => "r".to_owned(),
    }
}

/// A node's refusal of a semaphore's capacity (`-3`: held with another
/// capacity; `-4`: more permits asked for than there are).
fn semaphore_refusal(
    keys: &LockKeys,
    code: i64,
    value: i64,
    capacity: u32,
    permits: u32,
) -> LockError {
    let name = keys.name().to_owned();
    if code == -3 {
        ConfigError::PermitsMismatch {
            name,
            held: value.max(0) as u64,
            asked: u64::from(capacity),
        }
        .into()
    } else {
        ConfigError::InvalidLockOption {
            name,
            option: "permits",
            reason: format!(
                "the semaphore has {capacity} permits; {permits} can never be taken at once"
            ),
        }
        .into()
    }
}
