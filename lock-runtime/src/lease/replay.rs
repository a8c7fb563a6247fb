//! Making good on a new primary the releases the old one was told (issue
//! 38; docs/design.md §15 "Making good what the old primary was told").
//!
//! A release (or an in-process hand-off, which ends its holder's token)
//! that reached the old primary after the replica was promoted, and
//! before this client learned of the switch, never reaches the new one:
//! there the lock's copy holds every waiter back until its ttl passes. So
//! every client keeps a bounded log of its recent releases, each tagged
//! with the number of the last switch it knew of when it was sent
//! (`transport/switches.rs`); when it learns of a switch, it sends again,
//! to the new primary, every logged release sent before it whose key the
//! switch concerns. A release compares by token, and tokens are never
//! used twice: sent again, it deletes the lock's copy if it is still
//! there, and touches nothing else.
//!
//! Renewals are made good by the renewal driver (`renewal.rs`): on a
//! switch it renews every hold at once, on the new primary.
//!
//! Bounds: an entry is dropped once its lock's key could not exist any
//! more on any primary (its ttl after the release was sent, plus the drift
//! margin: the key there was set or renewed before that), and the log
//! keeps at most [`CAPACITY`] entries (the oldest dropped first). A
//! release dropped unlogged whose effect the new primary lacks costs its
//! lock a ttl, as before.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio::time::Instant;

use crate::backend::{Backend, Found, Kind, Switch, Switches};
use crate::keys::LockKeys;
use crate::lease::hold::{drift_margin, Hold};
use crate::transport::cluster::slots::slot;

/// The most releases a client's log keeps.
pub(crate) const CAPACITY: usize = 16_384;

/// How many releases are sent again at once after a switch.
const AT_ONCE: usize = 32;

/// One release, as it was sent.
#[derive(Clone)]
struct Logged {
    kind: Kind,
    keys: LockKeys,
    token: String,
    /// With `hold_at_least`: until when the key was to be kept.
    keep_until: Option<Instant>,
    /// The key cannot exist after this on any primary.
    until: Instant,
    /// The last switch the client knew of when it was sent.
    tag: u64,
}

impl Logged {
    fn concerned_by(&self, switch: &Switch) -> bool {
        self.tag < switch.number
            && switch.concerns(switch.slots.is_some().then(|| slot(&self.keys.lock)))
    }
}

/// A client's log of recent releases (see the module's documentation).
pub(crate) struct Replays {
    backend: Arc<dyn Backend>,
    switches: Arc<Switches>,
    log: Mutex<VecDeque<Logged>>,
    /// The task that waits for switches, started with the first entry.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Whether that task runs (read on every release: the task's mutex is
    /// taken only when it does not).
    watching: Arc<AtomicBool>,
}

/// Clears `watching` when the task ends, or is dropped with its runtime.
struct Watching(Arc<AtomicBool>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Replays {
    /// The log of a client whose backend can learn of switches of primary
    /// (Sentinel, a Redis Cluster); `None` otherwise.
    pub(crate) fn new(backend: &Arc<dyn Backend>) -> Option<Arc<Replays>> {
        let switches = backend.switches()?;
        Some(Arc::new(Replays {
            backend: Arc::clone(backend),
            switches,
            log: Mutex::new(VecDeque::new()),
            task: Mutex::new(None),
            watching: Arc::new(AtomicBool::new(false)),
        }))
    }

    fn log(&self) -> MutexGuard<'_, VecDeque<Logged>> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What a release sent now is tagged with.
    pub(crate) fn tag(&self) -> u64 {
        self.switches.current()
    }

    /// `hold`'s token was released (or passed on) by a call sent at
    /// `sent_at`, tagged `tag`. On the common path one mutex and no
    /// allocation once the log is full or its oldest entry expired (that
    /// entry's memory is reused).
    pub(crate) fn released(self: &Arc<Self>, hold: &Hold, tag: u64, sent_at: Instant) {
        let keep = hold.keep_for();
        let keep_until = (!keep.is_zero()).then(|| sent_at + keep);
        let until = sent_at + hold.ttl.max(keep) + drift_margin(hold.ttl);
        let mut log = self.log();
        // The oldest entry, if it can go: its memory is reused.
        let reused = match log.front() {
            Some(oldest) if oldest.until <= sent_at || log.len() >= CAPACITY => log.pop_front(),
            _ => None,
        };
        let entry = match reused {
            Some(mut entry) => {
                entry.keys.copy_from(&hold.keys);
                entry.token.clear();
                entry.token.push_str(&hold.token);
                entry.kind = hold.kind;
                entry.keep_until = keep_until;
                entry.until = until;
                entry.tag = tag;
                entry
            }
            None => Logged {
                kind: hold.kind,
                keys: hold.keys.clone(),
                token: hold.token.clone(),
                keep_until,
                until,
                tag,
            },
        };
        // A switch learned of while it was on its way: sent again now.
        let late = tag != self.switches.current()
            && self
                .switches
                .since(tag)
                .iter()
                .any(|switch| entry.concerned_by(switch));
        if late {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (this, entry) = (Arc::clone(self), entry.clone());
                runtime.spawn(async move { this.replay(vec![entry]).await });
            }
        }
        log.push_back(entry);
        drop(log);
        if !self.watching.load(Ordering::Acquire) {
            self.watch();
        }
    }

    /// Starts the task that waits for switches, if it does not run (first
    /// use, or the runtime it ran on has shut down).
    fn watch(self: &Arc<Self>) {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let changes = self.switches.subscribe();
        let seen = self.switches.current();
        self.watching.store(true, Ordering::Release);
        let watching = Watching(Arc::clone(&self.watching));
        *task = Some(runtime.spawn(watch_switches(
            Arc::downgrade(self),
            changes,
            seen,
            watching,
        )));
    }

    /// The logged releases a switch numbered after `seen` concerns, newest
    /// first (the likeliest to be missing), still able to matter.
    fn concerned(&self, switches: &[Switch]) -> Vec<Logged> {
        let now = Instant::now();
        let log = self.log();
        log.iter()
            .rev()
            .filter(|entry| entry.until > now)
            .filter(|entry| switches.iter().any(|switch| entry.concerned_by(switch)))
            .cloned()
            .collect()
    }

    /// Sends `entries` again (to the primary each key is on now),
    /// [`AT_ONCE`] at a time; each tried again after a failure while its
    /// key could exist.
    async fn replay(&self, entries: Vec<Logged>) {
        let count = entries.len();
        let made_good: usize = futures_util::stream::iter(entries)
            .map(|entry| self.replay_one(entry))
            .buffer_unordered(AT_ONCE)
            .map(usize::from)
            .fold(0, |sum, one| async move { sum + one })
            .await;
        if made_good > 0 {
            tracing::info!(
                releases = made_good,
                sent_again = count,
                "after a switch of primary, releases the new primary had not received were made \
                 good there (their locks would otherwise have stayed taken until their ttl)"
            );
        }
    }

    /// One release sent again; whether it found the lock's copy there.
    async fn replay_one(&self, entry: Logged) -> bool {
        let mut pause = Duration::from_millis(20);
        loop {
            let keep_ms = entry.keep_until.map_or(0, |until| {
                until.saturating_duration_since(Instant::now()).as_millis() as u64
            });
            match self
                .backend
                .release(entry.kind, &entry.keys, &entry.token, keep_ms)
                .await
            {
                Ok(release) => return release.found == Found::Mine,
                Err(error) => {
                    if Instant::now() + pause >= entry.until {
                        tracing::debug!(
                            lock = %entry.keys.name(), %error,
                            "a release sent again after a switch of primary failed"
                        );
                        return false;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

impl Drop for Replays {
    fn drop(&mut self) {
        let task = self
            .task
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Waits for switches while the client lives; sends again the logged
/// releases each concerns.
async fn watch_switches(
    replays: Weak<Replays>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    mut seen: u64,
    _watching: Watching,
) {
    while changes.changed().await.is_ok() {
        let Some(this) = replays.upgrade() else {
            return;
        };
        let switches = this.switches.since(seen);
        seen = switches.last().map_or(seen, |switch| switch.number);
        let entries = this.concerned(&switches);
        if !entries.is_empty() {
            tokio::spawn(async move { this.replay(entries).await });
        }
    }
}
