//! The renewal driver: one per client (so one per process with the global
//! client), not one task per lock.
//!
//! Every renewed lock is due for renewal a third of its ttl after its last
//! confirmed acquire or renewal was sent. The driver sleeps until the first
//! due time, then takes every lock due within the next few milliseconds and
//! renews them together: one pipelined round trip carrying one script call
//! per 100 locks. Each round trip has its own deadline. A lock whose renewal
//! fails is retried shortly after, for as long as its validity lasts; a lock
//! whose key is gone or held by another, or whose renewal Redis refuses (a
//! permission, a script error), is marked lost at once.
//!
//! The driver task holds only a weak reference to its renewer: once the
//! client and every lock it renews are gone, the renewer (and with it the
//! connection) is dropped and the task ends.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Found, RenewItem, Switch, Switches};
use crate::error::LostCause;
use crate::keys::LockKeys;
use crate::lease::hold::{drift_margin, Hold};
use crate::lease::loss;
use crate::lease::replay::Replays;
use crate::transport::cluster::slots::slot;
use crate::transport::switches::GRACE;

/// A lock is renewed with the others of a tick when it is due within a
/// third of its renewal interval. Renewing a little early costs little, and
/// lets locks acquired at different times converge into the same round
/// trips; the window stays a fraction of the interval, so a lock is renewed
/// at most every two thirds of its interval (at most 4.5 renewals per ttl),
/// whatever its ttl.
fn coalesce_window(interval: Duration) -> Duration {
    interval / 3
}

/// How often a lock is renewed: a third of its ttl.
fn renew_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

/// A renewal of `hold` failed or was not decided: tried again soon if
/// there is time left, else dropped (the holder's own deadline reports the
/// loss). Returns whether it was dropped.
fn retry_or_give_up(registry: &mut Registry, id: u64, hold: &Hold, now: Instant) -> bool {
    let retry_at = now + retry_delay(hold.ttl);
    if retry_at + drift_margin(hold.ttl) < hold.valid_until() {
        registry.schedule(id, retry_at);
        false
    } else {
        registry.remove(id);
        true
    }
}

/// What the backend needs to renew the holds of `batch`.
fn renew_items(batch: &[(u64, Arc<Hold>)]) -> Vec<RenewItem<'_>> {
    batch
        .iter()
        .map(|(_, hold)| RenewItem {
            kind: hold.kind,
            keys: &hold.keys,
            token: &hold.token,
            ttl_ms: hold.ttl.as_millis() as u64,
        })
        .collect()
}

/// How soon a failed renewal is tried again.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

/// Counters of one client's renewal driver, since the client was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenewalStats {
    /// Locks being renewed right now.
    pub active: usize,
    /// Renewals sent (one per lock per renewal).
    pub renewals_sent: u64,
    /// Batches of renewals sent (the locks due together; one round trip to
    /// a server, one per primary they are on in a Redis Cluster).
    pub batches: u64,
    /// Round trips to Redis made by the driver (each carries many renewals).
    pub round_trips: u64,
    /// Round trips that failed or timed out (their locks were retried).
    pub failed_round_trips: u64,
    /// Renewals confirmed only after the lock's local validity had run out.
    pub late_renewals: u64,
    /// Locks the driver saw lost, each counted once, whatever the cause:
    /// the sum of `lost_in_redis`, `not_renewed`, `refused` and
    /// `max_hold_reached`.
    pub lost: u64,
    /// Lost locks whose renewal found the key gone or another holder's
    /// token in it ([`Deleted`](crate::LostCause::Deleted),
    /// [`Replaced`](crate::LostCause::Replaced), or, once the validity had
    /// run out, [`Expired`](crate::LostCause::Expired),
    /// [`TakenOver`](crate::LostCause::TakenOver)).
    pub lost_in_redis: u64,
    /// Lost locks whose validity ran out, or had no time left for another
    /// try, without a confirmed renewal
    /// ([`NotRenewed`](crate::LostCause::NotRenewed): Redis unreachable or
    /// slow, this process paused).
    pub not_renewed: u64,
    /// Lost locks whose renewal Redis refused
    /// ([`PermissionDenied`](crate::LostCause::PermissionDenied),
    /// [`Refused`](crate::LostCause::Refused)).
    pub refused: u64,
    /// Locks whose renewals stopped at their `max_hold`
    /// ([`MaxHold`](crate::LostCause::MaxHold)).
    pub max_hold_reached: u64,
}

#[derive(Default)]
struct Counters {
    renewals_sent: AtomicU64,
    batches: AtomicU64,
    round_trips: AtomicU64,
    failed_round_trips: AtomicU64,
    late_renewals: AtomicU64,
    lost: AtomicU64,
    lost_in_redis: AtomicU64,
    not_renewed: AtomicU64,
    refused: AtomicU64,
    max_hold_reached: AtomicU64,
}

struct Entry {
    hold: Arc<Hold>,
    renew_until: Option<Instant>,
    /// When the next renewal is due; `None` while one is in flight.
    due: Option<Instant>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    due: BTreeSet<(Instant, u64)>,
    entries: HashMap<u64, Entry>,
}

impl Registry {
    fn schedule(&mut self, id: u64, at: Instant) {
        if let Some(entry) = self.entries.get_mut(&id) {
            if let Some(previous) = entry.due.replace(at) {
                self.due.remove(&(previous, id));
            }
            self.due.insert((at, id));
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id) {
            if let Some(due) = entry.due {
                self.due.remove(&(due, id));
            }
        }
    }
}

pub(crate) struct Renewer {
    backend: Arc<dyn Backend>,
    /// The switches of primary the backend learns of (Sentinel, a Redis
    /// Cluster): the renewals each concerns are sent again at once, to the
    /// new primary.
    switches: Option<Arc<Switches>>,
    /// The client's log of releases made good after a switch: the renewals
    /// on a switch wait for it (`Replays::replayed`).
    replays: Option<Arc<Replays>>,
    registry: Mutex<Registry>,
    /// Shared with the driver task, which holds the renewer only weakly.
    wake: Arc<Notify>,
    /// The driver task, respawned if the runtime it ran on has shut down.
    driver: Mutex<Option<tokio::task::JoinHandle<()>>>,
    counters: Counters,
}

/// The driver: renews what is due, sleeps until the next due time, a new
/// registration or a switch of primary (then every lock the switch
/// concerns is renewed at once, on the new primary), and ends once its
/// renewer is gone.
async fn drive(renewer: Weak<Renewer>, wake: Arc<Notify>) {
    let (mut changes, mut seen) = match renewer.upgrade().and_then(|this| this.switches.clone()) {
        Some(switches) => (Some(switches.subscribe()), switches.current()),
        None => (None, 0),
    };
    loop {
        let Some(this) = renewer.upgrade() else {
            return;
        };
        let (batch, next_due) = this.take_due(Instant::now());
        if !batch.is_empty() {
            tokio::spawn(this.renew(batch));
            continue;
        }
        drop(this);
        // `Some(false)`: the switches' sender is gone (never while the
        // renewer lives; then no longer listened to).
        let switched = async {
            match changes.as_mut() {
                Some(changes) => Some(changes.changed().await.is_ok()),
                None => std::future::pending().await,
            }
        };
        // Biased (deterministic under a simulation): a wake-up first,
        // which consumes its notification.
        let switched = match next_due {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = wake.notified() => None,
                    switched = switched => switched,
                    _ = tokio::time::sleep_until(at) => None,
                }
            }
            None => {
                tokio::select! {
                    biased;
                    _ = wake.notified() => None,
                    switched = switched => switched,
                }
            }
        };
        if switched == Some(false) {
            changes = None;
        }
        if switched == Some(true) {
            let Some(this) = renewer.upgrade() else {
                return;
            };
            if let Some(switches) = &this.switches {
                let since = switches.since(seen);
                seen = since.last().map_or(seen, |switch| switch.number);
                match this.replays.clone() {
                    // The releases and passes the switch concerns made good
                    // first (at most half the hold-back, which the renewal
                    // must beat): else the holder a lock was passed to
                    // would find its passer's token (`replay.rs`).
                    Some(replays) => {
                        let at_most = GRACE.min(this.backend.call_deadline() / 2) / 2;
                        let this = Arc::clone(&this);
                        tokio::spawn(async move {
                            replays.replayed(seen, at_most).await;
                            this.renew_now(&since);
                        });
                    }
                    None => this.renew_now(&since),
                }
            }
        }
    }
}

/// Whether a switch of `switches` concerns the lock of `keys`.
fn concerned(switches: &[Switch], keys: &LockKeys) -> bool {
    switches
        .iter()
        .any(|switch| switch.concerns(switch.slots.is_some().then(|| slot(&keys.lock))))
}

/// A lock's place in the driver. Dropping it stops the lock's renewals; a
/// renewal already on the wire can only extend a key that still holds this
/// lock's token.
pub(crate) struct Registration {
    renewer: Arc<Renewer>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.renewer.registry().remove(self.id);
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        // The driver wakes, finds its renewer gone, and ends.
        self.wake.notify_one();
    }
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>, replays: Option<Arc<Replays>>) -> Arc<Renewer> {
        Arc::new(Renewer {
            switches: backend.switches(),
            replays,
            backend,
            registry: Mutex::new(Registry::default()),
            wake: Arc::new(Notify::new()),
            driver: Mutex::new(None),
            counters: Counters::default(),
        })
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts renewing `hold` until the registration is dropped or, with
    /// `max_hold`, until `renew_until`.
    pub(crate) fn register(
        self: &Arc<Self>,
        hold: Arc<Hold>,
        renew_until: Option<Instant>,
    ) -> Registration {
        let due = hold.acquired_at + renew_interval(hold.ttl);
        let id = {
            let mut registry = self.registry();
            let id = registry.next_id;
            registry.next_id += 1;
            registry.entries.insert(
                id,
                Entry {
                    hold,
                    renew_until,
                    due: None,
                },
            );
            registry.schedule(id, due);
            id
        };
        {
            let mut driver = self
                .driver
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if driver.as_ref().is_none_or(|task| task.is_finished()) {
                *driver = Some(tokio::spawn(drive(
                    Arc::downgrade(self),
                    Arc::clone(&self.wake),
                )));
            }
        }
        self.wake.notify_one();
        Registration {
            renewer: Arc::clone(self),
            id,
        }
    }

    pub(crate) fn stats(&self) -> RenewalStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RenewalStats {
            active: self.registry().entries.len(),
            renewals_sent: load(&self.counters.renewals_sent),
            batches: load(&self.counters.batches),
            round_trips: load(&self.counters.round_trips),
            failed_round_trips: load(&self.counters.failed_round_trips),
            late_renewals: load(&self.counters.late_renewals),
            lost: load(&self.counters.lost),
            lost_in_redis: load(&self.counters.lost_in_redis),
            not_renewed: load(&self.counters.not_renewed),
            refused: load(&self.counters.refused),
            max_hold_reached: load(&self.counters.max_hold_reached),
        }
    }

    /// Counts a lock the driver stops renewing because it is lost
    /// (`cause`): once per lock, since its entry is removed with it.
    fn count_lost(&self, cause: LostCause) {
        let counters = &self.counters;
        let by_cause = match cause {
            LostCause::NotRenewed => &counters.not_renewed,
            LostCause::MaxHold => &counters.max_hold_reached,
            LostCause::PermissionDenied | LostCause::Refused => &counters.refused,
            LostCause::Released => return, // not in the driver: never seen here
            _ => &counters.lost_in_redis,
        };
        by_cause.fetch_add(1, Ordering::Relaxed);
        counters.lost.fetch_add(1, Ordering::Relaxed);
    }

    /// After a switch of primary: every lock `switches` concern is due now
    /// (a renewal in flight is sent again when it returns, see
    /// [`renew_part`](Self::renew_part)). Its renewal on the new primary
    /// makes good one the old primary alone got, or finds its key missing
    /// there and reports the lock lost.
    fn renew_now(&self, switches: &[Switch]) {
        let now = Instant::now();
        let mut registry = self.registry();
        let due: Vec<u64> = registry
            .entries
            .iter()
            .filter(|(_, entry)| entry.due.is_some() && concerned(switches, &entry.hold.keys))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            registry.schedule(id, now);
        }
        drop(registry);
        self.wake.notify_one();
    }

    /// Takes every lock due by now or within its coalescing window; returns
    /// them and the next due time after them.
    fn take_due(&self, now: Instant) -> (Vec<(u64, Arc<Hold>)>, Option<Instant>) {
        let mut guard = self.registry();
        let registry = &mut *guard;
        let mut batch = Vec::new();
        let mut unsettled = Vec::new();
        while let Some(&(at, id)) = registry.due.first() {
            let Some(entry) = registry.entries.get_mut(&id) else {
                registry.due.pop_first();
                continue;
            };
            if at > now + coalesce_window(renew_interval(entry.hold.ttl)) {
                break;
            }
            registry.due.pop_first();
            entry.due = None;
            if entry.renew_until.is_some_and(|until| now >= until) {
                // max_hold: stop renewing; the ttl runs out and the holder
                // is told by its own deadline.
                entry.hold.mark_max_hold_reached();
                registry.remove(id);
                self.count_lost(LostCause::MaxHold);
                continue;
            }
            if let Some(cause) = entry.hold.lost_cause(now) {
                registry.remove(id);
                self.count_lost(cause);
                continue;
            }
            if !entry.hold.is_settled() {
                // Passed in the process, its `HANDOFF` still in flight: its
                // token may not be in the key yet.
                unsettled.push((id, now + retry_delay(entry.hold.ttl)));
                continue;
            }

            batch.push((id, Arc::clone(&entry.hold)));
        }
        for (id, at) in unsettled {
            registry.schedule(id, at);
        }
        (batch, registry.due.first().map(|&(at, _)| at))
    }

    /// Renews a batch: one round trip per part (on a cluster, per
    /// primary), each part settled as soon as its own reply comes, so that
    /// a primary that is down or slow delays and fails only its own locks.
    async fn renew(self: Arc<Self>, batch: Vec<(u64, Arc<Hold>)>) {
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        let parts = if batch.len() > 1 {
            let items = renew_items(&batch);
            self.backend.partition(&items).await
        } else {
            Vec::new()
        };
        if parts.len() <= 1 {
            return self.renew_part(batch).await;
        }
        let mut batch: Vec<Option<(u64, Arc<Hold>)>> = batch.into_iter().map(Some).collect();
        let parts = parts.into_iter().map(|part| {
            let part: Vec<(u64, Arc<Hold>)> =
                part.into_iter().filter_map(|i| batch[i].take()).collect();
            Arc::clone(&self).renew_part(part)
        });
        futures_util::future::join_all(parts.collect::<Vec<_>>()).await;
    }

    async fn renew_part(self: Arc<Self>, batch: Vec<(u64, Arc<Hold>)>) {
        let sent_at = Instant::now();
        // A switch learned of while it is on its way may have sent it to
        // the old primary: the locks it concerns are renewed again at once.
        let tag = self.switches.as_ref().map(|switches| switches.current());
        let outcome = self.send(&batch).await;
        let now = Instant::now();
        let switched_since = match (&self.switches, tag) {
            (Some(switches), Some(tag)) if switches.current() != tag => switches.since(tag),
            _ => Vec::new(),
        };
        let mut registry = self.registry();
        match outcome {
            Ok(codes) => {
                let mut undecided = 0;
                for ((id, hold), code) in batch.iter().zip(codes) {
                    if !registry.entries.contains_key(id) {
                        continue; // released meanwhile: its result means nothing
                    }
                    if let Some(cause) = hold.lost_cause(now) {
                        // The holder was already told: a loss is final.
                        registry.remove(*id);
                        self.count_lost(cause);
                        continue;
                    }
                    let Some(code) = code else {
                        // Not decided (over a quorum: too few answers):
                        // this lock alone is tried again.
                        undecided += 1;
                        crate::observe::renewal_failed(hold.label());
                        if retry_or_give_up(&mut registry, *id, hold, now) {
                            self.count_lost(LostCause::NotRenewed);
                        }
                        continue;
                    };
                    match code {
                        Found::Mine => {
                            if now > hold.valid_until() {
                                self.counters.late_renewals.fetch_add(1, Ordering::Relaxed);
                            }
                            hold.extend(sent_at);
                            let next = if concerned(&switched_since, &hold.keys) {
                                now
                            } else {
                                sent_at + renew_interval(hold.ttl)
                            };
                            registry.schedule(*id, next);
                        }
                        found => {
                            // Gone or another's: deleted or replaced while
                            // the validity had time, else expired.
                            let cause = loss::shown(hold, found, now);
                            registry.remove(*id);
                            self.count_lost(cause);
                            hold.mark_lost(cause);
                        }
                    }
                }
                if undecided > 0 {
                    self.counters
                        .failed_round_trips
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        locks = undecided,
                        "lock renewal not confirmed; retrying while the locks are valid"
                    );
                }
            }
            Err(error) => {
                self.counters
                    .failed_round_trips
                    .fetch_add(1, Ordering::Relaxed);
                let refused = loss::refused(&error);
                match refused {
                    // Answered the same way every time: the locks cannot
                    // be kept. Each holder is told now, and logs it once.
                    Some(_) => {
                        tracing::debug!(%error, locks = batch.len(), "lock renewal refused by Redis")
                    }
                    None => {
                        tracing::warn!(%error, locks = batch.len(), "lock renewal failed; retrying while the locks are valid")
                    }
                }
                for (id, hold) in &batch {
                    if !registry.entries.contains_key(id) {
                        continue;
                    }
                    crate::observe::renewal_failed(hold.label());
                    if let Some(cause) = refused {
                        registry.remove(*id);
                        self.count_lost(cause);
                        hold.mark_refused(cause, &error);
                    } else if retry_or_give_up(&mut registry, *id, hold, now) {
                        self.count_lost(LostCause::NotRenewed);
                    }
                }
            }
        }
        drop(registry);
        self.wake.notify_one();
    }

    /// One round trip for the whole batch (see [`Backend::renew`]).
    async fn send(&self, batch: &[(u64, Arc<Hold>)]) -> redis::RedisResult<Vec<Option<Found>>> {
        let items = renew_items(batch);
        self.counters
            .renewals_sent
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        crate::observe::renewals(batch.len() as u64);
        self.backend.renew(&items, &self.counters.round_trips).await
    }
}
