//! The calls a quorum (RedLock, `quorum.rs`) makes on one of its nodes: one
//! node's part of an attempt (`quorum_acquire.lua`), the release or give-back
//! that wakes the first waiter in line there (`quorum_release.lua`), leaving
//! the line (`quorum_leave.lua`) and the fencing write-back
//! (`fence_raise.lua`).

use std::time::{Duration, Instant};

use super::{found, RedisBackend};
use crate::backend::scripts::{
    evalsha, run, Told, FENCE_RAISE, QUORUM_ACQUIRE, QUORUM_LEAVE, QUORUM_RELEASE,
};
use crate::backend::Release;
use crate::error::LockError;
use crate::keys::LockKeys;

/// One node's answer to its part of an attempt over a quorum, and the
/// node's clock (µs) when it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vote {
    pub(crate) kind: VoteKind,
    pub(crate) clock_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    },
}

/// What a node's refusal reports for a key it holds with no expiry: the
/// longest a waiter sleeps anyway (its place is refreshed sooner).
const NO_EXPIRY: Duration = Duration::from_secs(3600);

/// One attempt over a quorum, as each node is asked it: owned, so that the
/// calls to nodes that have not answered when the attempt settles can go on
/// in the background.
pub(crate) struct Ballot {
    pub(crate) keys: LockKeys,
    /// The attempt's value, `<token>|q<attempt>`.
    pub(crate) value: String,
    /// The caller's entry in the line (`<channel>|<token>`).
    pub(crate) member: String,
    pub(crate) ttl_ms: u64,
    pub(crate) fence_retention_ms: Option<u64>,
    pub(crate) waiter_timeout_ms: u64,
    /// Join (or refresh a place in) the line when not granted.
    pub(crate) join: bool,
    /// Defer to the first waiter in line.
    pub(crate) respect: bool,
    /// An earlier try of this call got no answer.
    pub(crate) mine: bool,
    /// The caller's ticket (0: none yet; the node's clock is used).
    pub(crate) ticket: u64,
}

impl RedisBackend {
    /// One node's part of an attempt over a quorum (`quorum_acquire.lua`).
    /// `not_after_us`: the node refuses to take part past this time on its
    /// clock (0: no limit).
    pub(crate) async fn vote(&self, ballot: &Ballot, not_after_us: u64) -> Result<Vote, LockError> {
        let keys = &ballot.keys;
        let retention_ms = ballot.fence_retention_ms.unwrap_or(0);
        let bytes = 4 * keys.lock.len() + 40 + ballot.value.len() + 80 + ballot.member.len();
        let mut cmd = evalsha(&QUORUM_ACQUIRE, 4, 14, bytes);
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters())
            .arg(&ballot.value)
            .arg(ballot.ttl_ms)
            .arg(retention_ms)
            .arg(ballot.waiter_timeout_ms)
            .arg(u8::from(ballot.join))
            .arg(u8::from(ballot.respect))
            .arg(&ballot.member);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(keys.name(), "acquire", |mut connection, number| {
            // A retry of this call recognises a lock its first try took.
            let mut cmd = cmd.clone();
            cmd.arg(u8::from(ballot.mine || number > 0))
                .arg(ballot.ticket)
                .arg(not_after_us);
            async move {
                let reply: Vec<i64> = run(&QUORUM_ACQUIRE, &cmd, &mut connection, scripts).await?;
                let at = |i: usize| reply.get(i).copied().unwrap_or(-1);
                let clock_us = reply.last().copied().unwrap_or(0).max(0) as u64;
                let kind = if at(0) == 1 {
                    VoteKind::Granted {
                        fence: ballot.fence_retention_ms.map(|_| at(1) as u64),
                    }
                } else if at(1) == -3 {
                    VoteKind::TooLate
                } else {
                    VoteKind::Refused {
                        // -2: free here (another is first in line); -1: a
                        // key with no expiry (not one of ours): held, for
                        // as long as anyone can tell.
                        held_for: match at(1) {
                            -2 => None,
                            -1 => Some(NO_EXPIRY),
                            ms => Some(Duration::from_millis(ms.max(0) as u64)),
                        },
                        ticket: at(2).max(0) as u64,
                        first: at(3) == 1,
                    }
                };
                Ok(Vote { kind, clock_us })
            }
        })
        .await
    }

    /// The release of an exclusive lock on one node of a quorum, or the
    /// give-back of a failed attempt (`quorum_release.lua`):
    /// compare-and-delete, then a wake-up for the first waiter in line
    /// (unless that is `own`, the giver's own entry).
    pub(crate) async fn release_waking(
        &self,
        keys: &LockKeys,
        token: &str,
        own: &str,
    ) -> Result<Release, LockError> {
        let mut cmd = evalsha(
            &QUORUM_RELEASE,
            4,
            6,
            4 * keys.lock.len() + token.len() + own.len() + 40,
        );
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters())
            .arg(token)
            .arg(own);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(
            keys.name(),
            "release",
            |mut connection, attempt| async move {
                let sent_at = Instant::now();
                let code = self.told(run(&QUORUM_RELEASE, cmd, &mut connection, scripts).await?);
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

    /// A waiter over a quorum leaves the line on this node
    /// (`quorum_leave.lua`).
    pub(crate) async fn leave_line(&self, keys: &LockKeys, member: &str) -> Result<(), LockError> {
        let mut cmd = evalsha(&QUORUM_LEAVE, 4, 5, 4 * keys.lock.len() + member.len() + 40);
        cmd.arg(&keys.lock)
            .arg(keys.fence())
            .arg(keys.tickets())
            .arg(keys.waiters())
            .arg(member);
        let (cmd, scripts) = (&cmd, self.connection.scripts());
        self.call(
            keys.name(),
            "leave the queue",
            |mut connection, _| async move {
                run::<Told>(&QUORUM_LEAVE, cmd, &mut connection, scripts)
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
