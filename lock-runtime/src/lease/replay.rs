//! Making good on a new primary the releases the old one was told (issue
//! 38; docs/design.md §15 "Making good what the old primary was told").
//!
//! A release (or an in-process hand-off, which ends its holder's token)
//! that reached the old primary after the replica was promoted, and
//! before this client learned of the switch, never reaches the new one:
//! there the lock's copy holds every waiter back until its ttl passes. So
//! every client keeps a bounded log of its recent releases and passes,
//! each tagged with the number of the last switch it knew of when it was
//! sent (`transport/switches.rs`); when it learns of a switch, for every
//! lock with a logged entry sent before it that the switch concerns, it
//! reads the lock's key on the new primary and, if the key holds a token
//! of its own, sends again what followed that token here, in order: each
//! pass as the same `HANDOFF` (to the next token of the process), then the
//! release that ended them. A pass and a release compare by token, and
//! tokens are never used twice: sent again, they change the lock's copy
//! only if it still holds that token. A pass is never sent again as a
//! release: its next holder may still run (the overlap found after
//! `CLUSTER FAILOVER FORCE`, design §15).
//!
//! The renewal driver's renewals on a switch wait for that round (at most
//! a quarter of a call deadline, [`Replays::replayed`]), and a release,
//! pass or renewal of a holder the lock was passed to that finds another
//! token makes its key good first and is sent once more
//! ([`Replays::adopt`]): sent before the round, it would find its passer's
//! token and take the lock for lost.
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

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio::time::Instant;

use crate::backend::{Backend, Found, Kind, Pass, Switch, Switches};
use crate::error::LockError;
use crate::keys::LockKeys;
use crate::lease::hold::{drift_margin, Hold};
use crate::signal::Signal;
use crate::transport::cluster::slots::slot;

/// The most releases a client's log keeps.
pub(crate) const CAPACITY: usize = 16_384;

/// How many locks are made good at once after a switch.
const AT_ONCE: usize = 32;

/// One release or in-process pass, as it was sent.
#[derive(Clone)]
struct Logged {
    kind: Kind,
    keys: LockKeys,
    token: String,
    /// A pass: the token the lock went to, and that holder's ttl in ms.
    /// `None`: a release.
    next: Option<(String, u64)>,
    /// With `hold_at_least`: until when the key was to be kept.
    keep_until: Option<Instant>,
    /// The key cannot hold `token` after this on any primary.
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
    /// The last switch whose first round of making good is over (the
    /// renewal driver waits for it before it renews on the new primary).
    replayed: Signal<u64>,
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
            replayed: Signal::new(0),
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

    /// Waits until the first round of making good after switch `switch`
    /// is over, at most `at_most`: the renewal driver's renewals on a
    /// switch wait for it, so that the holder a lock was passed to does not
    /// find its passer's token there (a pass the old primary alone got)
    /// and take the lock for lost.
    pub(crate) async fn replayed(&self, switch: u64, at_most: Duration) {
        if !self.watching.load(Ordering::Acquire) || *self.replayed.borrow() >= switch {
            return;
        }
        let _ = tokio::time::timeout(at_most, self.replayed.wait_for(|done| *done >= switch)).await;
    }

    /// `hold`, passed its lock in the process, found another token in the
    /// key: if the pass to it is logged, the key is made good now (its
    /// passer's token, which a new primary may still hold, moved on to
    /// `hold`'s), and the caller sends its call once more. Whether it was.
    pub(crate) async fn adopt(&self, hold: &Hold) -> bool {
        let group = self.group(&hold.keys.lock);
        let passed_to_hold = group.iter().any(|entry| {
            entry
                .next
                .as_ref()
                .is_some_and(|(next, _)| *next == hold.token)
        });
        if passed_to_hold {
            self.make_good(group).await;
        }
        passed_to_hold
    }

    /// `hold`'s token was released by a call sent at `sent_at`, tagged
    /// `tag`; `inferred`: Redis found another token or none, and an
    /// earlier attempt is taken to have done it. An inferred release of a
    /// token logged as passed on is not logged: it is the pass that ended
    /// it (sent again as a release, it would delete the key under the
    /// holder it went to, should the pass's entry be dropped first).
    pub(crate) fn released(
        self: &Arc<Self>,
        hold: &Hold,
        tag: u64,
        sent_at: Instant,
        inferred: bool,
    ) {
        if inferred
            && self
                .log()
                .iter()
                .any(|entry| entry.next.is_some() && entry.token == hold.token)
        {
            return;
        }
        self.record(hold, None, tag, sent_at);
    }

    /// `hold`'s lock was passed in the process to the holder of token
    /// `next` (its ttl `ttl_ms`) by a `HANDOFF` sent at `sent_at`, tagged
    /// `tag`.
    pub(crate) fn passed(
        self: &Arc<Self>,
        hold: &Hold,
        next: &str,
        ttl_ms: u64,
        tag: u64,
        sent_at: Instant,
    ) {
        self.record(hold, Some((next, ttl_ms)), tag, sent_at);
    }

    /// Logs one release or pass. On the common path one mutex and no
    /// allocation once the log is full or its oldest entry expired (that
    /// entry's memory is reused).
    fn record(
        self: &Arc<Self>,
        hold: &Hold,
        next: Option<(&str, u64)>,
        tag: u64,
        sent_at: Instant,
    ) {
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
                entry.next = match (entry.next.take(), next) {
                    (Some((mut token, _)), Some((next, ttl_ms))) => {
                        token.clear();
                        token.push_str(next);
                        Some((token, ttl_ms))
                    }
                    (_, next) => next.map(|(next, ttl_ms)| (next.to_owned(), ttl_ms)),
                };
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
                next: next.map(|(next, ttl_ms)| (next.to_owned(), ttl_ms)),
                keep_until,
                until,
                tag,
            },
        };
        // A switch learned of while it was on its way: made good now.
        let late = tag != self.switches.current()
            && self
                .switches
                .since(tag)
                .iter()
                .any(|switch| entry.concerned_by(switch));
        let key = late.then(|| entry.keys.lock.clone());
        log.push_back(entry);
        drop(log);
        if let Some(key) = key {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let this = Arc::clone(self);
                runtime.spawn(async move {
                    let group = this.group(&key);
                    this.replay(vec![group]).await
                });
            }
        }
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
        self.replayed.send_if_modified(|done| raise(done, seen));
        self.watching.store(true, Ordering::Release);
        let watching = Watching(Arc::clone(&self.watching));
        *task = Some(runtime.spawn(watch_switches(
            Arc::downgrade(self),
            changes,
            seen,
            watching,
        )));
    }

    /// Per lock a switch numbered after `seen` concerns: every entry of its
    /// key still able to matter, oldest first (a chain of passes is
    /// followed from the token the new primary holds). One pass over the
    /// log.
    fn concerned(&self, switches: &[Switch]) -> Vec<Vec<Logged>> {
        let now = Instant::now();
        let log = self.log();
        let mut at: HashMap<&str, usize> = HashMap::new();
        let mut groups: Vec<(bool, Vec<Logged>)> = Vec::new();
        for entry in log.iter().filter(|entry| entry.until > now) {
            let index = *at.entry(&entry.keys.lock).or_insert_with(|| {
                groups.push((false, Vec::new()));
                groups.len() - 1
            });
            let (concerned, group) = &mut groups[index];
            *concerned |= switches.iter().any(|switch| entry.concerned_by(switch));
            group.push(entry.clone());
        }
        groups
            .into_iter()
            .filter_map(|(concerned, group)| concerned.then_some(group))
            .collect()
    }

    /// Every entry of `key` still able to matter, oldest first.
    fn group(&self, key: &str) -> Vec<Logged> {
        let now = Instant::now();
        self.log()
            .iter()
            .filter(|entry| entry.until > now && entry.keys.lock == key)
            .cloned()
            .collect()
    }

    /// Makes good the locks of `groups` (each the entries of one key) on
    /// the primary each key is on now, [`AT_ONCE`] locks at a time.
    async fn replay(&self, groups: Vec<Vec<Logged>>) {
        let sent_again: usize = groups.iter().map(Vec::len).sum();
        let made_good: usize = futures_util::stream::iter(groups)
            .map(|group| self.make_good(group))
            .buffer_unordered(AT_ONCE)
            .fold(0, |sum, one| async move { sum + one })
            .await;
        if made_good > 0 {
            tracing::info!(
                releases = made_good,
                sent_again,
                "after a switch of primary, releases the new primary had not received were made \
                 good there (their locks would otherwise have stayed taken until their ttl)"
            );
        }
    }

    /// Makes good one lock's entries; how many changed its key.
    ///
    /// An exclusive lock's key is read first: if it holds a token this
    /// client released or passed on, what followed that token here is sent
    /// again in order (each pass as the same `HANDOFF`, then the release
    /// that ended the chain, if any), so that a lock passed in the process
    /// to a holder that still runs is never deleted under it. A
    /// read/write lock's or a semaphore's releases are each sent again (a
    /// compare-and-delete by token, never passed on).
    async fn make_good(&self, group: Vec<Logged>) -> usize {
        let Some(first) = group.first() else {
            return 0;
        };
        if first.kind != Kind::Exclusive {
            let mut made_good = 0;
            for entry in group.iter().filter(|entry| entry.next.is_none()) {
                made_good += usize::from(self.send_again(entry).await);
            }
            return made_good;
        }
        let until = group
            .iter()
            .map(|entry| entry.until)
            .max()
            .unwrap_or(first.until);
        let Some(held) = self.held(&first.keys, until).await else {
            return 0;
        };
        let Some(mut at) = group.iter().position(|entry| entry.token == held) else {
            return 0; // not this client's
        };
        let mut made_good = 0;
        for _ in 0..group.len() {
            let entry = &group[at];
            if !self.send_again(entry).await {
                break;
            }
            made_good += 1;
            let Some((next, _)) = &entry.next else {
                break; // released
            };
            match group.iter().position(|entry| entry.token == *next) {
                Some(following) => at = following,
                None => break, // its holder still holds it
            }
        }
        made_good
    }

    /// The token the exclusive lock of `keys` holds now (without its wake
    /// mark); `None`: no key, a key kept after its release, or no answer
    /// while it could still matter (`until`).
    async fn held(&self, keys: &LockKeys, until: Instant) -> Option<String> {
        let readings = retried(keys, until, "reading a lock to make it good", || {
            self.backend.peek(keys)
        })
        .await?;
        let value = readings.into_iter().flatten().next()?.value?;
        if value.starts_with("kept:") {
            return None;
        }
        value.split('|').next().map(str::to_owned)
    }

    /// One release or pass sent again, while its key could hold its token;
    /// whether it found its token there.
    async fn send_again(&self, entry: &Logged) -> bool {
        let keys = &entry.keys;
        let sent = retried(keys, entry.until, "sending a release again", || async {
            match &entry.next {
                Some((next, ttl_ms)) => self
                    .backend
                    .pass(keys, &entry.token, next, *ttl_ms, None)
                    .await
                    .map(|pass| matches!(pass, Pass::Passed { .. })),
                None => {
                    let keep_ms = entry.keep_until.map_or(0, |until| {
                        until.saturating_duration_since(Instant::now()).as_millis() as u64
                    });
                    self.backend
                        .release(entry.kind, keys, &entry.token, keep_ms)
                        .await
                        .map(|release| release.found == Found::Mine)
                }
            }
        })
        .await;
        sent.unwrap_or(false)
    }
}

/// `call` on the lock of `keys`, tried again after a failure (pauses from
/// 20 ms, doubled up to 1 s) while it could still matter (`until`);
/// `None` once it no longer can.
async fn retried<T, F: Future<Output = Result<T, LockError>>>(
    keys: &LockKeys,
    until: Instant,
    what: &str,
    mut call: impl FnMut() -> F,
) -> Option<T> {
    let mut pause = Duration::from_millis(20);
    loop {
        match call().await {
            Ok(answer) => return Some(answer),
            Err(error) => {
                if Instant::now() + pause >= until {
                    tracing::debug!(
                        lock = %keys.name(), %error,
                        "{what} after a switch of primary failed"
                    );
                    return None;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
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

/// Waits for switches while the client lives; makes good the locks each
/// concerns, and marks its first round over (for [`Replays::replayed`]).
async fn watch_switches(
    replays: Weak<Replays>,
    mut changes: crate::signal::Changes,
    mut seen: u64,
    _watching: Watching,
) {
    while changes.changed().await.is_ok() {
        let Some(this) = replays.upgrade() else {
            return;
        };
        let switches = this.switches.since(seen);
        seen = switches.last().map_or(seen, |switch| switch.number);
        let groups = this.concerned(&switches);
        if !groups.is_empty() {
            let round = tokio::spawn({
                let this = Arc::clone(&this);
                async move { this.replay(groups).await }
            });
            // Past a call deadline the round goes on in the background.
            let _ = tokio::time::timeout(this.backend.call_deadline(), round).await;
        }
        this.replayed.send_if_modified(|done| raise(done, seen));
    }
}

/// Raises `done` to `seen`; whether it moved.
fn raise(done: &mut u64, seen: u64) -> bool {
    let moved = seen > *done;
    *done = (*done).max(seen);
    moved
}
