//! In-process hand-off ("lock cohorting"): the tasks of one client waiting
//! for the same key queue here, in the process, behind one of them, the
//! client's representative for that key, which holds the lock in Redis or
//! waits for it there. A holder that is done while tasks of its client wait
//! here passes the lock to the first of them with one script (`HANDOFF`:
//! compare its token, set the next holder's, with that holder's ttl)
//! instead of a release, a pub/sub message and an acquire. The next holder
//! gets its own token, ttl, renewal and (when asked) fencing token.
//!
//! Without `fencing`, the next holder starts at once, while the `HANDOFF`
//! is in flight ("early pass"): until it is confirmed the key holds the
//! passing holder's token, which this client owns, so the next holder runs
//! under that holder's validity (capped by its own ttl from the pass), and
//! nothing is sent with its token before the outcome is known. A confirmed
//! `HANDOFF` extends its validity to its own ttl; a refused one (the
//! passing holder's key was gone or another's, which only a lost write or a
//! deleted key can cause within its validity) marks it lost. A fencing
//! token is only known from the reply, so with `fencing` the next holder
//! starts when the reply is in.
//!
//! Other processes are not starved: while the lock's wake mark (over a
//! quorum, the line on the nodes that took the pass) shows waiters queued
//! in Redis, a holder passes it on locally
//! at most [`MAX_PASSES_WHILE_QUEUED`] times in a row; then it releases it
//! through Redis (waking the first of them), and the local waiters queue in
//! Redis like anyone else. `fair` locks never pass locally.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::LostCause;
use crate::lease::hold::Hold;

/// Local passes in a row while waiters of other clients are queued.
pub(crate) const MAX_PASSES_WHILE_QUEUED: u32 = 4;

/// How often a local waiter checks that its cohort still gets somewhere:
/// its holder still holds the lock, its representative still waits for it.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(500);

/// A representative waiting in Redis shows a sign of life at least this
/// often (each poll of its acquire; a waiter in Redis wakes at least every
/// 500 ms); one that stops (its future parked, not dropped) is given up.
const STALE_AFTER: Duration = Duration::from_secs(2);

/// The waiting tasks of one client, per lock key.
#[derive(Default)]
pub(crate) struct Cohorts {
    by_key: Mutex<HashMap<String, Cohort>>,
    next_id: AtomicU64,
}

/// A cohort: one exists for a key while a task of this client holds it or
/// waits for it in Redis for the others.
struct Cohort {
    /// Tells this cohort from an earlier one of the same key.
    generation: u64,
    waiters: VecDeque<Waiter>,
    /// Local passes made in a row while others were queued in Redis.
    passes_while_queued: u32,
    /// The hold passed around; none while the representative waits.
    holder: Option<Weak<Hold>>,
    /// The representative's last sign of life while it waits, or the last
    /// pass (the next holder registers its hold a moment after it).
    heartbeat: Instant,
}

/// A task waiting in the process for a lock its client's representative
/// holds or waits for.
pub(crate) struct Waiter {
    id: u64,
    /// What the hold passed to it is made with.
    pub(crate) wants: Wants,
    sender: oneshot::Sender<Passed>,
}

/// What a local waiter asked of its lock: the hold passed to it is made
/// with these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wants {
    pub(crate) ttl: Duration,
    pub(crate) fencing: bool,
    pub(crate) renewed: bool,
    pub(crate) stop_on_loss: bool,
    pub(crate) hold_at_least: Option<Duration>,
}

impl Waiter {
    /// Hands the waiter its outcome; gives it back if the waiter is gone.
    pub(crate) fn send(self, passed: Passed) -> Result<(), Passed> {
        self.sender.send(passed)
    }
}

/// What a local waiter is told.
pub(crate) enum Passed {
    /// The lock is its own, this hold (made with its [`Wants`]); maybe with
    /// its `HANDOFF` still in flight (an early pass, see the module's docs).
    Lock(Arc<Hold>),
    /// No local hand-off: try through Redis.
    Redis,
}

/// The outcome of joining a key's cohort.
pub(crate) enum Joined {
    /// Nobody of this client holds or waits for the key: the caller goes to
    /// Redis for the others (for the cohort of this generation), and
    /// dissolves the cohort if it does not get the lock.
    Representative(u64),
    /// Queued in the process, in the cohort of this generation.
    Queued(oneshot::Receiver<Passed>, u64, u64),
}

/// What a cohort holder's release does.
pub(crate) enum Next {
    /// Pass the lock to this waiter.
    Pass(Waiter),
    /// Release through Redis (others are queued there and had their share
    /// of local passes), then [`dissolve`](Cohorts::dissolve): until then
    /// the local waiters stay queued, so none races the woken waiter.
    Release,
    /// Nobody waits here (the cohort is dissolved): a plain release.
    Alone,
}

impl Cohorts {
    fn by_key(&self) -> MutexGuard<'_, HashMap<String, Cohort>> {
        self.by_key
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cohort of `key` of this generation, if it still exists.
    fn cohort<'a>(
        by_key: &'a mut HashMap<String, Cohort>,
        key: &str,
        generation: u64,
    ) -> Option<&'a mut Cohort> {
        by_key
            .get_mut(key)
            .filter(|cohort| cohort.generation == generation)
    }

    /// Whether a task of this client holds `key` or waits for it in Redis
    /// for the others (a cohort exists).
    pub(crate) fn exists(&self, key: &str) -> bool {
        self.by_key().contains_key(key)
    }

    /// How many tasks wait in the cohort of `key`.
    pub(crate) fn waiting(&self, key: &str) -> usize {
        self.by_key()
            .get(key)
            .map_or(0, |cohort| cohort.waiters.len())
    }

    /// Joins the cohort of `key`.
    pub(crate) fn join(&self, key: &str, wants: Wants) -> Joined {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut by_key = self.by_key();
        match by_key.get_mut(key) {
            None => {
                by_key.insert(
                    key.to_owned(),
                    Cohort {
                        generation: id,
                        waiters: VecDeque::new(),
                        passes_while_queued: 0,
                        holder: None,
                        heartbeat: Instant::now(),
                    },
                );
                Joined::Representative(id)
            }
            Some(cohort) => {
                let (sender, receiver) = oneshot::channel();
                cohort.waiters.push_back(Waiter { id, wants, sender });
                Joined::Queued(receiver, id, cohort.generation)
            }
        }
    }

    /// The representative of this generation is still at it.
    pub(crate) fn heartbeat(&self, key: &str, generation: u64) {
        if let Some(cohort) = Self::cohort(&mut self.by_key(), key, generation) {
            cohort.heartbeat = Instant::now();
        }
    }

    /// The cohort's lock is held now, by `hold`.
    pub(crate) fn holds(&self, key: &str, generation: u64, hold: &Arc<Hold>) {
        if let Some(cohort) = Self::cohort(&mut self.by_key(), key, generation) {
            cohort.holder = Some(Arc::downgrade(hold));
        }
    }

    /// Whether the cohort of this generation gets nowhere: its holder lost
    /// the lock (or is gone without releasing), or its representative
    /// stopped showing signs of life. A released holder is passing the lock
    /// on, or dissolving the cohort: not stuck.
    pub(crate) fn stuck(&self, key: &str, generation: u64) -> bool {
        let mut by_key = self.by_key();
        let Some(cohort) = Self::cohort(&mut by_key, key, generation) else {
            return false;
        };
        match &cohort.holder {
            Some(holder) => match holder.upgrade() {
                // Gone: released and passed on, the next holder about to
                // register, or dropped without a release.
                None => cohort.heartbeat.elapsed() > STALE_AFTER,
                Some(hold) => !matches!(
                    hold.lost_cause(Instant::now()),
                    None | Some(LostCause::Released)
                ),
            },
            None => cohort.heartbeat.elapsed() > STALE_AFTER,
        }
    }

    /// Whether a task of this client holds the lock of the cohort of this
    /// generation now, by its own account: not while the representative
    /// waits in Redis, nor once the holder lost the lock or released it (a
    /// pass still open).
    pub(crate) fn held(&self, key: &str, generation: u64) -> bool {
        let mut by_key = self.by_key();
        Self::cohort(&mut by_key, key, generation)
            .and_then(|cohort| cohort.holder.as_ref()?.upgrade())
            .is_some_and(|hold| hold.lost_cause(Instant::now()).is_none())
    }

    /// A waiter stops waiting: out of the queue, if it is still there.
    pub(crate) fn leave(&self, key: &str, id: u64) {
        if let Some(cohort) = self.by_key().get_mut(key) {
            cohort.waiters.retain(|waiter| waiter.id != id);
        }
    }

    /// The holder of the cohort of this generation is done.
    pub(crate) fn next(&self, key: &str, generation: u64) -> Next {
        let mut by_key = self.by_key();
        let Some(cohort) = Self::cohort(&mut by_key, key, generation) else {
            return Next::Alone;
        };
        if cohort.waiters.is_empty() {
            by_key.remove(key);
            return Next::Alone;
        }
        if cohort.passes_while_queued >= MAX_PASSES_WHILE_QUEUED {
            return Next::Release;
        }
        match cohort.waiters.pop_front() {
            Some(waiter) => Next::Pass(waiter),
            None => Next::Alone,
        }
    }

    /// A pass was made; `queued`: waiters of other clients are queued.
    pub(crate) fn passed(&self, key: &str, generation: u64, queued: bool) {
        if let Some(cohort) = Self::cohort(&mut self.by_key(), key, generation) {
            cohort.heartbeat = Instant::now();
            cohort.passes_while_queued = if queued {
                cohort.passes_while_queued + 1
            } else {
                0
            };
        }
    }

    /// The cohort of this generation ends: every local waiter goes to
    /// Redis itself.
    pub(crate) fn dissolve(&self, key: &str, generation: u64) {
        let cohort = {
            let mut by_key = self.by_key();
            match by_key.get(key) {
                Some(cohort) if cohort.generation == generation => by_key.remove(key),
                _ => None,
            }
        };
        for waiter in cohort.into_iter().flat_map(|cohort| cohort.waiters) {
            let _ = waiter.send(Passed::Redis);
        }
    }
}

/// Waits for `receiver` at most `wait`; `None` when the wait ran out.
/// Wakes every [`CHECK_EVERY`] to give up a stuck cohort (then the caller
/// is told to go to Redis).
pub(crate) async fn wait_for_pass(
    cohorts: &Cohorts,
    key: &str,
    generation: u64,
    receiver: &mut oneshot::Receiver<Passed>,
    wait: Duration,
) -> Option<Passed> {
    let deadline = Instant::now().checked_add(wait);
    loop {
        let left = deadline.map_or(Duration::MAX, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        match tokio::time::timeout(left.min(CHECK_EVERY), &mut *receiver).await {
            Ok(Ok(passed)) => return Some(passed),
            Ok(Err(_closed)) => return Some(Passed::Redis),
            Err(_elapsed) if left <= CHECK_EVERY => return None,
            Err(_elapsed) => {
                if cohorts.stuck(key, generation) {
                    cohorts.dissolve(key, generation);
                }
            }
        }
    }
}
