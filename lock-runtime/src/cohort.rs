//! In-process hand-off ("lock cohorting"): the tasks of one client waiting
//! for the same key queue here, in the process, behind one of them, the
//! client's representative for that key, which holds the lock in Redis or
//! waits for it there. A holder that is done while tasks of its client wait
//! here passes the lock to the first of them with one script (`HANDOFF`:
//! compare its token, set the next holder's, with that holder's ttl)
//! instead of a release, a pub/sub message and an acquire. The next holder
//! gets its own token, ttl, renewal and (when asked) fencing token.
//!
//! Other processes are not starved: while the lock's wake mark shows
//! waiters of other clients queued in Redis, a holder passes it on locally
//! at most [`MAX_PASSES_WHILE_QUEUED`] times in a row; then it releases it
//! through Redis (waking the first of them), and the local waiters queue in
//! Redis like anyone else. `fair` locks never pass locally.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Local passes in a row while waiters of other clients are queued.
pub(crate) const MAX_PASSES_WHILE_QUEUED: u32 = 4;

/// The waiting tasks of one client, per lock key.
#[derive(Default)]
pub(crate) struct Cohorts {
    by_key: Mutex<HashMap<String, Cohort>>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Cohort {
    /// A task of this client holds the key, or waits for it in Redis for
    /// the others.
    busy: bool,
    waiters: VecDeque<Waiter>,
    /// Local passes made in a row while others were queued in Redis.
    passes_while_queued: u32,
}

/// A task waiting in the process for a lock its client's representative
/// holds or waits for.
pub(crate) struct Waiter {
    id: u64,
    /// The waiter's ttl and whether it wants a fencing token: what the hold
    /// passed to it is made with.
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    sender: oneshot::Sender<Passed>,
}

impl Waiter {
    /// Hands the waiter its outcome; gives it back if the waiter is gone.
    pub(crate) fn send(self, passed: Passed) -> Result<(), Passed> {
        self.sender.send(passed)
    }
}

/// What a local waiter is told.
#[derive(Debug)]
pub(crate) enum Passed {
    /// The lock is its own: this token is in the key, set at `sent_at` with
    /// its ttl.
    Lock {
        token: String,
        sent_at: Instant,
        fence: Option<u64>,
    },
    /// No local hand-off: try through Redis.
    Redis,
}

/// The outcome of joining a key's cohort.
pub(crate) enum Joined {
    /// Nobody of this client holds or waits for the key: the caller goes to
    /// Redis for the others, and dissolves the cohort if it does not get
    /// the lock.
    Representative,
    /// Queued in the process.
    Queued(oneshot::Receiver<Passed>, u64),
}

impl Cohorts {
    fn by_key(&self) -> MutexGuard<'_, HashMap<String, Cohort>> {
        self.by_key
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Joins the cohort of `key`.
    pub(crate) fn join(&self, key: &str, ttl_ms: u64, fencing: bool) -> Joined {
        let mut by_key = self.by_key();
        let cohort = by_key.entry(key.to_owned()).or_default();
        if !cohort.busy {
            cohort.busy = true;
            return Joined::Representative;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        cohort.waiters.push_back(Waiter {
            id,
            ttl_ms,
            fencing,
            sender,
        });
        Joined::Queued(receiver, id)
    }

    /// A waiter stops waiting: out of the queue, if it is still there.
    pub(crate) fn leave(&self, key: &str, id: u64) {
        if let Some(cohort) = self.by_key().get_mut(key) {
            cohort.waiters.retain(|waiter| waiter.id != id);
        }
    }

    /// The holder of `key` is done: the waiter to pass the lock to, or none
    /// (no waiter, or others queued in Redis for too many local passes in a
    /// row). With none, the cohort is dissolved: its waiters go to Redis.
    pub(crate) fn next(&self, key: &str) -> Option<Waiter> {
        let mut by_key = self.by_key();
        let cohort = by_key.get_mut(key)?;
        if cohort.passes_while_queued < MAX_PASSES_WHILE_QUEUED {
            if let Some(waiter) = cohort.waiters.pop_front() {
                return Some(waiter);
            }
        }
        drop(by_key);
        self.dissolve(key);
        None
    }

    /// A pass was made; `queued`: waiters of other clients are queued.
    pub(crate) fn passed(&self, key: &str, queued: bool) {
        if let Some(cohort) = self.by_key().get_mut(key) {
            cohort.passes_while_queued = if queued {
                cohort.passes_while_queued + 1
            } else {
                0
            };
        }
    }

    /// Nobody of this client holds or waits for `key` in Redis any more:
    /// every local waiter goes to Redis itself.
    pub(crate) fn dissolve(&self, key: &str) {
        let cohort = self.by_key().remove(key);
        for waiter in cohort.into_iter().flat_map(|cohort| cohort.waiters) {
            let _ = waiter.send(Passed::Redis);
        }
    }
}

/// Waits for `receiver` at most `wait`; `None` when the wait ran out (or
/// the cohort went away).
pub(crate) async fn wait_for_pass(
    receiver: &mut oneshot::Receiver<Passed>,
    wait: Duration,
) -> Option<Passed> {
    match tokio::time::timeout(wait, receiver).await {
        Ok(Ok(passed)) => Some(passed),
        Ok(Err(_closed)) => Some(Passed::Redis),
        Err(_elapsed) => None,
    }
}
