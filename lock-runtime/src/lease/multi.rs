//! Taking a set of exclusive locks at once (`Lock::all`): every lock or
//! none, without deadlock (docs/design.md §16).
//!
//! - **Together:** when the backend can take every key in one script (one
//!   node; one slot of a cluster), `acquire_all.lua` takes all or none, and
//!   a waiter stands in every key's queue, woken by the release of any.
//! - **One by one** (keys across cluster slots, a quorum, acknowledged
//!   mode; `set_by_key.rs`): a try of each key in the set's order; on a
//!   busy key, what was taken is given back and the waiter stands in the
//!   line of every key, holding nothing, trying them all at each wake-up.
//!   Nobody ever waits while holding part of a set, so no cycle of waiters
//!   can form.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::backend::{
    retryable, wait_for, AcquireAll, AcquireAllRequest, Kind, Respect, Subscription,
};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::lease::acquire::{
    Acquisition, TakenAt, FALLBACK_PAUSE, FIRST_ERROR_PAUSE, QUEUE_REFRESH, WAITER_TIMEOUT,
};
use crate::lease::guard::LockGuard;
use crate::lease::hold::{fence_retention_ms, late_reply, Acquired, Hold};
use crate::lease::release::spawn_release;
use crate::lease::watch::Entry;
use crate::lease::Core;

/// One call of `acquire` on a set: one acquisition per distinct name, in
/// the set's canonical (sorted) order.
pub(crate) struct SetAcquisition<'a> {
    pub(crate) members: Vec<Acquisition<'a>>,
    pub(crate) wait: Option<Duration>,
    pub(crate) started: Instant,
}

/// A set waiter's id in the queues of its keys: its token followed by `*`,
/// so that another set's attempt, which lets queued single-key waiters go
/// first (`fair`), does not wait for a set waiter (two sets waiting for each
/// other's place in line would wait forever).
fn set_waiter(token: &str) -> String {
    format!("{token}*")
}

impl SetAcquisition<'_> {
    /// The guards of every lock of the set, in its order.
    pub(crate) async fn take(&self, entry: Entry) -> Result<Vec<LockGuard>, LockError> {
        let mut guards: Vec<Option<LockGuard>> = self.members.iter().map(|_| None).collect();
        let mut rest = Vec::with_capacity(self.members.len());
        for (index, member) in self.members.iter().enumerate() {
            match &member.held {
                // Held up this task's call chain: shared, as a single lock
                // would be (README, "Reentrancy").
                Some(scope) => guards[index] = Some(member.reentered(scope, entry).await?),
                None => rest.push(index),
            }
        }
        if !rest.is_empty() {
            let first = &self.members[rest[0]];
            if rest.len() < self.members.len() && first.settings.fencing {
                let held = self.members.iter().find(|member| member.held.is_some());
                return Err(ConfigError::Reentry {
                    name: held.map_or(first.name, |member| member.name).to_owned(),
                    reason: "this set asks for `fencing`, and this lock of it is already held up \
                             the call chain: one token for the whole set would need a new \
                             acquisition of that lock; take the whole set in the outer lock, or \
                             drop `fencing` from the inner one",
                }
                .into());
            }
            let members: Vec<&Acquisition<'_>> =
                rest.iter().map(|&index| &self.members[index]).collect();
            let keys: Vec<LockKeys> = members.iter().map(|member| member.keys.clone()).collect();
            let taken = if first.core.backend().takes_together(&keys) {
                self.together(&members, &keys).await?
            } else {
                self.one_by_one(&members).await?
            };
            for (index, guard) in rest.into_iter().zip(taken) {
                guards[index] = Some(guard);
            }
            return Ok(guards.into_iter().flatten().collect());
        }
        // Every lock of the set is held up the call chain (by outer locks
        // taken one by one, each with its own token): the set's token is the
        // largest of theirs, raised on every key's fence and in every outer
        // hold, so that no later token of any key is smaller (design §16).
        let guards: Vec<LockGuard> = guards.into_iter().flatten().collect();
        if self.members[0].settings.fencing {
            raise_fences(&self.members[0], &guards).await?;
        }
        Ok(guards)
    }

    pub(super) fn deadline(&self) -> Option<Instant> {
        self.wait.and_then(|wait| self.started.checked_add(wait))
    }

    pub(super) fn wait_timeout(&self, name: &str) -> LockError {
        LockError::WaitTimeout {
            name: name.to_owned(),
            waited: self.started.elapsed(),
        }
    }

    /// Every lock in one script per attempt (`acquire_all.lua`); a waiter
    /// stands in every queue of the set and is woken by any release.
    async fn together(
        &self,
        members: &[&Acquisition<'_>],
        keys: &[LockKeys],
    ) -> Result<Vec<LockGuard>, LockError> {
        let first = members[0];
        let core = &first.core;
        let settings = first.settings;
        let token = core.new_token()?;
        let waiter = set_waiter(&token);
        let waits = self.wait.is_some();
        let deadline = self.deadline();
        let notifier = core.notifier();
        let (channel, slot) = notifier.channel_for(&keys[0].lock);
        let member = Kind::Exclusive.queue_entry(&channel, &waiter);
        let mut unknown = SetUnknown {
            members,
            token: &token,
            last_sent: Instant::now(),
            open: false,
            stalled: false,
        };
        let mut place = SetPlace {
            core,
            keys,
            member: &member,
            joined: false,
        };
        let mut subscription = if waits {
            notifier.join_ready(&waiter, slot)
        } else {
            None
        };
        // Right after this client handed one of the keys over, every waiter
        // goes first until the set's first wait (§4).
        let handed_over = members
            .iter()
            .any(|member| core.just_handed_over(&member.keys.lock));
        let mut respect = if handed_over {
            Respect::Everyone
        } else {
            first.fair()
        };
        let mut error_pause = FIRST_ERROR_PAUSE;
        loop {
            let notified = subscription.as_ref().map(Subscription::notified);
            let request = AcquireAllRequest {
                keys,
                token: &token,
                ttl_ms: first.ttl_ms,
                fence_retention_ms: settings.fencing.then(|| fence_retention_ms(first.ttl_ms)),
                member: &member,
                join: waits,
                respect,
                mine: unknown.sent(),
                waiter_timeout_ms: WAITER_TIMEOUT.as_millis() as u64,
            };
            place.joined |= waits;
            let mut reply = core.backend().acquire_all(request).await;
            // Valid no longer when the reply came: no lock (the attempt
            // stays open, as `acquire.rs` does for a single lock).
            if let Ok(AcquireAll::Acquired { found, .. }) = &reply {
                if let Some(late) = late_reply(unknown.last_sent, *found, settings.ttl) {
                    reply = Err(LockError::redis(first.name, "acquire", late));
                }
            }
            let (index, expires_in) = match reply {
                Ok(AcquireAll::Acquired { fence, found }) => {
                    place.joined = false; // the script took it out of every queue
                    return Ok(unknown.acquired(fence, found));
                }
                Ok(AcquireAll::Busy { index, expires_in }) => {
                    unknown.resolved();
                    error_pause = FIRST_ERROR_PAUSE;
                    (index.min(members.len() - 1), expires_in)
                }
                Err(LockError::Redis { source, .. })
                    if waits
                        && retryable(&source)
                        && deadline
                            .is_none_or(|deadline| Instant::now() + error_pause < deadline) =>
                {
                    if !source.is_connection_refusal() {
                        unknown.stalled = true;
                    }
                    tokio::time::sleep(error_pause).await;
                    error_pause = (error_pause * 2).min(QUEUE_REFRESH);
                    continue;
                }
                Err(error) => {
                    if matches!(&error, LockError::Redis { source, .. } if !source.is_connection_refusal())
                    {
                        unknown.stalled = true;
                    }
                    return Err(error);
                }
            };
            let name = members[index].name;
            if !waits {
                return Err(LockError::Busy {
                    name: name.to_owned(),
                });
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(self.wait_timeout(name));
            }
            if subscription.is_none() {
                // Listen, then try again at once: a release in between is
                // not missed (as a single lock's waiter does).
                let left = deadline.map_or(Duration::MAX, |deadline| deadline - now);
                subscription = Some(
                    notifier
                        .subscribe(&waiter, slot, left.min(QUEUE_REFRESH))
                        .await,
                );
                continue;
            }
            // A holder that just handed one of the keys over lets its waiter
            // go first only until its own first wait.
            respect = first.fair();
            let mut pause = expires_in.map_or(FALLBACK_PAUSE, |expires_in| {
                expires_in.saturating_add(Duration::from_millis(1))
            });
            pause = pause.min(QUEUE_REFRESH);
            if let Some(deadline) = deadline {
                pause = pause.min(deadline - now);
            }
            wait_for(notified, pause).await;
        }
    }
}

/// The attempts of a set taken together whose outcome is unknown (see
/// `acquire.rs`'s `Unknown`): if the acquisition ends without the set, each
/// key that may hold the token is released in the background.
struct SetUnknown<'a, 'b> {
    members: &'a [&'a Acquisition<'b>],
    token: &'a str,
    last_sent: Instant,
    open: bool,
    stalled: bool,
}

impl SetUnknown<'_, '_> {
    fn sent(&mut self) -> bool {
        let earlier = self.open;
        self.last_sent = Instant::now();
        self.open = true;
        earlier
    }

    fn resolved(&mut self) {
        if !self.stalled {
            self.open = false;
        }
    }

    /// The guards of the set: taken by this attempt (validity from its send
    /// time), or found taken by an earlier one (validity from the smallest
    /// remaining ttl).
    fn acquired(mut self, fence: Option<u64>, found: Option<Duration>) -> Vec<LockGuard> {
        self.open = false;
        let ttl = self.members[0].settings.ttl;
        let (sent_at, expires_by) = match found {
            None => (self.last_sent, None),
            Some(remaining) => {
                let expiry = self.last_sent + remaining;
                (
                    expiry.checked_sub(ttl).unwrap_or(self.last_sent),
                    Some(expiry),
                )
            }
        };
        self.members
            .iter()
            .map(|member| {
                member.guard(
                    self.token.to_owned(),
                    TakenAt {
                        sent_at,
                        expires_by,
                        fence,
                        stalled: self.stalled,
                        plain: false,
                    },
                )
            })
            .collect()
    }
}

impl Drop for SetUnknown<'_, '_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        for member in self.members {
            let acquired = member.acquired(self.token.to_owned(), self.last_sent, None);
            spawn_release(
                Hold::new(Acquired {
                    hold_at_least: None,
                    linger: self.stalled,
                    ..acquired
                }),
                false,
            );
        }
    }
}

/// A set waiter's places in the queues of its keys, given up when it stops
/// waiting without the set.
struct SetPlace<'a> {
    core: &'a Arc<Core>,
    keys: &'a [LockKeys],
    member: &'a str,
    joined: bool,
}

impl Drop for SetPlace<'_> {
    fn drop(&mut self) {
        if !self.joined {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the places expire after WAITER_TIMEOUT
        };
        let (core, keys, member) = (
            Arc::clone(self.core),
            self.keys.to_vec(),
            self.member.to_owned(),
        );
        runtime.spawn(async move {
            let leaving = keys
                .iter()
                .map(|keys| core.backend().leave(Kind::Exclusive, keys, &member));
            // Best effort: a place not given up expires after WAITER_TIMEOUT.
            let _ = join_all(leaving).await;
        });
    }
}

/// One fencing token for a set whose keys got a token each (taken key by
/// key, or held by outer locks): the largest of them, written to the fence
/// of every key whose token is smaller (`fence_raise.lua`) so that every
/// later token of each key is larger, and reported by every hold.
pub(super) async fn raise_fences(
    first: &Acquisition<'_>,
    guards: &[LockGuard],
) -> Result<(), LockError> {
    let Some(token) = guards
        .iter()
        .filter_map(|guard| guard.fencing_token())
        .max()
    else {
        return Ok(());
    };
    let retention_ms = fence_retention_ms(first.ttl_ms);
    let backend = first.core.backend();
    let behind = guards
        .iter()
        .filter(|guard| guard.fencing_token().is_some_and(|own| own < token));
    let raised = join_all(behind.map(|guard| {
        let keys = &guard.hold().keys;
        backend.fence_at_least(keys, token, retention_ms)
    }))
    .await;
    raised.into_iter().collect::<Result<Vec<()>, _>>()?;
    for guard in guards {
        guard.hold().raise_fence(token);
    }
    Ok(())
}
