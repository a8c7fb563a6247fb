//! What a holder knows about its lock, shared between the holder, the renewal
//! driver and `current()`: identity, a local validity deadline on the
//! monotonic clock, and whether (and why) the lock was lost.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::holders::{Recorded, Site};
use super::Core;
use crate::backend::Kind;
use crate::error::LostCause;
use crate::keys::LockKeys;
use crate::observe::DEFAULT_METRIC_LABEL;

/// The origin of the nanosecond counts kept in atomics: a day before the
/// first reading. Under tokio's paused time (a simulation) each runtime's
/// clock starts at the real time it was built and moves on virtually, so a
/// later runtime's clock can read earlier than an earlier runtime's did: the
/// day keeps every reading of a program's runtimes after the origin (a
/// reading before it would count as the origin, and a validity would end
/// too early).
static CLOCK_BASE: LazyLock<Instant> = LazyLock::new(|| {
    let now = Instant::now();
    now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now)
});

fn to_nanos(instant: Instant) -> u64 {
    u64::try_from(instant.saturating_duration_since(*CLOCK_BASE).as_nanos()).unwrap_or(u64::MAX)
}

fn from_nanos(nanos: u64) -> Instant {
    *CLOCK_BASE + Duration::from_nanos(nanos)
}

/// The margin taken off every validity period for clock drift between this
/// host and Redis: 1 % of the ttl plus 2 ms (as in the Redlock analysis),
/// never more than the ttl itself.
pub(crate) fn drift_margin(ttl: Duration) -> Duration {
    (ttl / 100 + Duration::from_millis(2)).min(ttl)
}

/// An acquiring reply that came too late to be of use: the lock it took
/// (at `sent_at`, with `ttl`; `found`: found already taken with its token,
/// with that much ttl left) would be valid no longer by the time the
/// reply came (a request that sat in a stalled server, a reply held up
/// longer than the ttl). Such a lock is never handed out: the caller treats
/// the attempt as one without an answer (a waiter tries again, and its
/// next attempt finds the key with its token and the ttl the key really
/// has; else the key is released in the background). The error says so.
///
/// A ttl no longer than its drift margin (2 ms or less) gives a fresh lock
/// no validity however fast the reply: such a lock is handed out as before
/// (its holder's body is all it has), or no call could ever take it.
pub(crate) fn late_reply(
    sent_at: Instant,
    found: Option<Duration>,
    ttl: Duration,
) -> Option<redis::RedisError> {
    if found.is_none() && drift_margin(ttl) >= ttl {
        return None;
    }
    let expiry = sent_at + found.map_or(ttl, |remaining| remaining.min(ttl));
    let valid_until = expiry.checked_sub(drift_margin(ttl)).unwrap_or(sent_at);
    let now = Instant::now();
    (now >= valid_until).then(|| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "Redis answered {:?} after the request, when the lock's validity (ttl {ttl:?}) \
                 was already over: not acquired, and the lock is released in the background \
                 (a longer ttl leaves more room for a slow server)",
                now - sent_at
            ),
        )
        .into()
    })
}

/// Fencing counters live at least this long after their last acquisition.
const FENCE_RETENTION: Duration = Duration::from_secs(60);

/// How long a fencing counter is kept after an acquisition with `ttl_ms`:
/// max(60 s, ttl).
pub(crate) fn fence_retention_ms(ttl_ms: u64) -> u64 {
    (FENCE_RETENTION.as_millis() as u64).max(ttl_ms)
}

/// What an acquisition produced: everything a [`Hold`] starts from.
pub(crate) struct Acquired {
    /// What the client that made it shares (its backend among them).
    pub(crate) core: Arc<Core>,
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    pub(crate) renewed: bool,
    /// When the acquiring command was sent.
    pub(crate) sent_at: Instant,
    /// When its reply arrived.
    pub(crate) confirmed_at: Instant,
    /// Issued when the lock was taken with `fencing`.
    pub(crate) fencing_token: Option<u64>,
    pub(crate) hold_at_least: Option<Duration>,
    /// For a renewed lock: stop a body run under it when it is lost.
    pub(crate) stop_on_loss: bool,
    /// An attempt of the acquisition timed out: a command stuck in the
    /// replaced connection may still reach Redis later.
    pub(crate) linger: bool,
    /// The key expires no earlier than this (known when the lock was found
    /// already taken with its token, with its remaining ttl, or, for a lock
    /// passed in the process before its `HANDOFF` is confirmed, from the
    /// passing holder's validity).
    pub(crate) expires_by: Option<Instant>,
    /// For a lock passed in the process while its `HANDOFF` is in flight:
    /// turns `true` once the outcome is applied to the hold. Nothing is sent
    /// to Redis with the token before that.
    pub(crate) settled: Option<watch::Receiver<bool>>,
    /// Taken by a plain `SET NX PX`: see [`Hold::plain`].
    pub(crate) plain: bool,
}

pub(crate) struct Hold {
    /// What the client that made it shares (its backend among them).
    pub(crate) core: Arc<Core>,
    /// Exclusive, a read share, the write side, or semaphore permits.
    pub(crate) kind: Kind,
    pub(crate) keys: LockKeys,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    /// Whether a renewal driver keeps this lock, and so whether the body is
    /// stopped when the validity runs out.
    pub(crate) renewed: bool,
    /// When the acquiring command was sent.
    pub(crate) acquired_at: Instant,
    /// The loss was counted in the metrics and logged.
    loss_counted: AtomicBool,
    /// What Redis answered when it refused a renewal (a permission, a
    /// script error): logged with the loss.
    refusal: OnceLock<String>,
    /// When the acquiring reply arrived: the key was set before this.
    pub(crate) confirmed_at: Instant,
    pub(crate) fencing_token: Option<u64>,
    /// A release keeps the key until at least this long after acquisition.
    pub(crate) hold_at_least: Option<Duration>,
    /// Whether a body run under this lock is stopped when it is lost
    /// (renewed and `OnLost::Stop`); reentrant entries share it.
    pub(crate) stop_on_loss: bool,
    /// An acquire attempt with this token timed out, so a copy of it may
    /// still reach Redis (from the stalled connection) after the release:
    /// releases keep checking for the token while the lock could live.
    /// Also set when the outcome of the `HANDOFF` that passed this lock in
    /// the process is unknown.
    linger: AtomicBool,
    /// See [`Acquired::settled`].
    settled: Option<watch::Receiver<bool>>,
    /// See [`Hold::mark_pass_refused`].
    pass_refused: AtomicBool,
    /// Never handed out to its caller (see [`Hold::never_handed_out`]):
    /// its release keeps nothing for `hold_at_least`.
    never_handed_out: AtomicBool,
    /// Taken by a plain `SET NX PX`, so its key most likely holds exactly
    /// its token (no waiter has marked it): its release tries the server's
    /// plain conditional delete first, where there is one (design §2, "A
    /// release without Lua"). A hint only: the command compares the value.
    pub(crate) plain: bool,
    /// The fencing token of the set this hold belongs to, when it is larger
    /// than the hold's own (a set taken key by key: `lease/multi.rs`); 0
    /// otherwise.
    set_fence: AtomicU64,
    /// Until when the lock is known to be valid: the send time of the last
    /// confirmed acquire or renewal, plus ttl, minus the drift margin.
    valid_until: AtomicU64,
    /// 0 while held, else a `LostCause` code. Set once.
    lost: AtomicU8,
    /// Renewals stopped because `max_hold` was reached.
    max_hold_reached: AtomicBool,
    /// Wakes every body run under this hold when it is lost or released;
    /// made by the first body that needs it.
    lost_signal: OnceLock<Arc<Notify>>,
    /// When the loss was recorded (the simulation's checkers read it).
    #[cfg(feature = "simulation")]
    lost_at: OnceLock<Instant>,
    /// Handed to its holder by another task of the client (an in-process
    /// pass; the simulation's checkers read it).
    #[cfg(feature = "simulation")]
    passed_in_process: AtomicBool,
    /// How its holder took it (metric label, function) and its place in the
    /// client's holder record; set when a guard is made for it.
    site: OnceLock<Site>,
    /// Counted in the held gauge (from `taken_by` until released or lost).
    counted_held: AtomicBool,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.stop_holding();
    }
}

impl Recorded for Hold {
    fn taken_at(&self) -> Instant {
        self.acquired_at
    }

    fn kind(&self) -> Kind {
        self.kind
    }

    fn token(&self) -> &str {
        &self.token
    }

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn caller(&self) -> Option<&str> {
        Hold::caller(self)
    }
}

impl Hold {
    /// The lock's name, as given.
    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    pub(crate) fn new(acquired: Acquired) -> Arc<Hold> {
        let Acquired {
            core,
            kind,
            keys,
            token,
            ttl,
            renewed,
            sent_at,
            confirmed_at,
            fencing_token,
            hold_at_least,
            stop_on_loss,
            linger,
            expires_by,
            settled,
            plain,
        } = acquired;
        let expiry = expires_by.map_or(sent_at + ttl, |by| by.min(sent_at + ttl));
        let valid_until = to_nanos(expiry.checked_sub(drift_margin(ttl)).unwrap_or(sent_at));
        Arc::new(Hold {
            core,
            kind,
            keys,
            token,
            ttl,
            renewed,
            acquired_at: sent_at,
            loss_counted: AtomicBool::new(false),
            refusal: OnceLock::new(),
            confirmed_at,
            fencing_token,
            hold_at_least,
            stop_on_loss: renewed && stop_on_loss,
            linger: AtomicBool::new(linger),
            settled,
            pass_refused: AtomicBool::new(false),
            never_handed_out: AtomicBool::new(false),
            plain,
            set_fence: AtomicU64::new(0),
            valid_until: AtomicU64::new(valid_until),
            lost: AtomicU8::new(0),
            max_hold_reached: AtomicBool::new(false),
            lost_signal: OnceLock::new(),
            #[cfg(feature = "simulation")]
            lost_at: OnceLock::new(),
            #[cfg(feature = "simulation")]
            passed_in_process: AtomicBool::new(false),
            site: OnceLock::new(),
            counted_held: AtomicBool::new(false),
        })
    }

    /// The hold is its holder's now: `label` names it in the metrics,
    /// `caller` in the holder record, which gets it (see `holders.rs`).
    pub(crate) fn taken_by(
        self: &Arc<Self>,
        label: Option<&Cow<'static, str>>,
        caller: Option<&Cow<'static, str>>,
    ) {
        if self.site.get().is_some() {
            return;
        }
        let set = self.site.set(Site {
            label: label
                .or(caller)
                .cloned()
                .unwrap_or(Cow::Borrowed(DEFAULT_METRIC_LABEL)),
            caller: caller.cloned(),
            _registered: self.core.holders().register(self),
        });
        if set.is_ok() && self.reported_loss().is_none() {
            self.counted_held.store(true, Ordering::Release);
            crate::observe::holding(self.label(), true);
        }
    }

    /// The hold is no longer held (released, dropped or lost): out of the
    /// held gauge, once.
    fn stop_holding(&self) {
        if self.counted_held.swap(false, Ordering::AcqRel) {
            crate::observe::holding(self.label(), false);
        }
    }

    /// The fencing token its holder uses: its own, or its set's (see
    /// [`Hold::raise_fence`]).
    pub(crate) fn fencing(&self) -> Option<u64> {
        self.fencing_token
            .map(|own| own.max(self.set_fence.load(Ordering::Acquire)))
    }

    /// This hold is part of a set whose fencing token is `token` (the
    /// largest of its keys', raised on every key's fence).
    pub(crate) fn raise_fence(&self, token: u64) {
        self.set_fence.fetch_max(token, Ordering::AcqRel);
    }

    /// Whether a holder was ever given this hold (a guard made for it). The
    /// hold of an acquisition whose outcome stayed unknown, released in the
    /// background after its caller was told it failed, never was.
    pub(crate) fn was_handed_out(&self) -> bool {
        self.site.get().is_some()
    }

    /// The `lock` label of its metrics (`Lock::metric_label`).
    pub(crate) fn label(&self) -> &str {
        self.site
            .get()
            .map_or(DEFAULT_METRIC_LABEL, |site| &site.label)
    }

    /// The function that took it (`Lock::caller`, the attribute's
    /// function), if it was named.
    pub(crate) fn caller(&self) -> Option<&str> {
        self.site.get().and_then(|site| site.caller.as_deref())
    }

    /// The token alone, without what a value may add after `|` (over a
    /// quorum, the attempt's mark).
    pub(crate) fn token_head(&self) -> &str {
        self.token.split('|').next().unwrap_or(&self.token)
    }

    /// Whether a copy of a command with this token may still reach Redis
    /// after the release (see the field).
    pub(crate) fn linger(&self) -> bool {
        self.linger.load(Ordering::Acquire)
    }

    pub(crate) fn set_linger(&self) {
        self.linger.store(true, Ordering::Release);
    }

    /// Waits until the `HANDOFF` that passed this lock in the process (if it
    /// was) has its outcome applied: called before anything is sent with the
    /// token, so that it never reaches Redis before the token is there.
    ///
    /// Bounded by the hold's validity (capped at the passer's until the
    /// outcome is in): past it the lock is gone either way, and a passer
    /// whose runtime is no longer driven must not hang its successor.
    pub(crate) async fn settled(&self) {
        if let Some(settled) = &self.settled {
            // A dropped sender (its task cancelled) settles it too.
            let mut settled = settled.clone();
            let until = self.valid_until();
            let _ = tokio::time::timeout_at(until, settled.wait_for(|settled| *settled)).await;
        }
    }

    /// The `HANDOFF` that passed this lock early was refused: whatever its
    /// holder did since (a release marks it released), it must not pass
    /// the lock on early.
    pub(crate) fn mark_pass_refused(&self) {
        self.pass_refused.store(true, Ordering::Release);
    }

    pub(crate) fn pass_refused(&self) -> bool {
        self.pass_refused.load(Ordering::Acquire)
    }

    /// Whether [`settled`](Hold::settled) would return at once.
    pub(crate) fn is_settled(&self) -> bool {
        self.settled
            .as_ref()
            .is_none_or(|settled| *settled.borrow() || settled.has_changed().is_err())
    }

    /// Whether this holds the same lock (same Redis, same key) as `other`.
    pub(crate) fn same_lock(&self, core: &Arc<Core>, keys: &LockKeys) -> bool {
        Arc::ptr_eq(&self.core, core) && self.keys.lock == keys.lock
    }

    /// With `hold_at_least`: how much longer a release must keep the key.
    /// Counted from when the acquiring reply arrived, which is after Redis
    /// set the key, so the key is never kept for less than asked.
    pub(crate) fn keep_for(&self) -> Duration {
        if self.never_handed_out.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        self.hold_at_least
            .map(|at_least| at_least.saturating_sub(self.confirmed_at.elapsed()))
            .unwrap_or(Duration::ZERO)
    }

    /// This lock is given back without ever being handed out (a set's key
    /// taken before another key was found busy, a set whose validity was
    /// over when it was complete): no job ran under it, so its release
    /// deletes the key rather than keep it for `hold_at_least`.
    pub(crate) fn never_handed_out(&self) {
        self.never_handed_out.store(true, Ordering::Relaxed);
    }

    pub(crate) fn valid_until(&self) -> Instant {
        from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// A renewal sent at `sent_at` was confirmed: the key lives at least
    /// until `sent_at + ttl`. Only ever moves the deadline forward.
    pub(crate) fn extend(&self, sent_at: Instant) {
        let until = to_nanos(sent_at + self.ttl - drift_margin(self.ttl));
        self.valid_until.fetch_max(until, Ordering::AcqRel);
    }

    /// A manual extension with `ttl` sent at `sent_at` was confirmed
    /// (`LockGuard::extend`, never on a renewed lock): the key lives until
    /// `sent_at + ttl`, which may be sooner than what was known before.
    pub(crate) fn extend_for(&self, sent_at: Instant, ttl: Duration) {
        let until = to_nanos(sent_at + ttl - drift_margin(ttl));
        self.valid_until.store(until, Ordering::Release);
    }

    /// Counts the loss `cause` in the metrics and logs it at warn, once
    /// per hold, when it reaches the holder (its body stopped, its release,
    /// its guard dropped). Called inside the hold's span where there is one
    /// (`lock.hold`, or `lock.release`), so that the one event operators
    /// look for names the lock, the cause and, for a refused renewal,
    /// Redis's answer.
    pub(crate) fn count_loss(&self, cause: LostCause) {
        self.count_loss_as(cause, "");
    }

    /// [`count_loss`](Hold::count_loss) for a body that runs on
    /// (`OnLost::Continue`), logged as soon as the loss is seen.
    pub(crate) fn count_loss_running_on(&self, cause: LostCause) {
        self.count_loss_as(
            cause,
            "; the body runs on (on_lost = continue): another holder may run beside it from now",
        );
    }

    fn count_loss_as(&self, cause: LostCause, note: &str) {
        if self.loss_counted.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::observe::lost(self.label(), cause);
        if cause == LostCause::Released {
            return; // an entry that outlived its outer hold: not a loss of the lock
        }
        crate::observe::hold_ended(self.label(), "lost", self.acquired_at.elapsed());
        match self.refusal.get() {
            Some(refusal) => tracing::warn!(
                lock = %self.name(), cause = cause.label(), error = %refusal,
                "lock lost: {cause}{note}"
            ),
            None => tracing::warn!(
                lock = %self.name(), cause = cause.label(),
                "lock lost: {cause}{note}"
            ),
        }
    }

    /// Records the loss (the first cause wins) and wakes the holder. Only
    /// renewed locks record losses. Logged when it reaches the holder
    /// ([`count_loss`](Hold::count_loss)), not here: once per loss, however
    /// many parts notice it.
    pub(crate) fn mark_lost(&self, cause: LostCause) {
        let first = self
            .lost
            .compare_exchange(0, cause.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            tracing::debug!(lock = %self.name(), cause = %cause, "lock lost; the holder is told");
            #[cfg(feature = "simulation")]
            let _ = self.lost_at.set(Instant::now());
        }
        self.stop_holding();
        self.wake();
    }

    /// Redis refused a renewal (`cause`: a permission, a script error; its
    /// answer `error`): the lock cannot be kept, so it is lost now.
    pub(crate) fn mark_refused(&self, cause: LostCause, error: &redis::RedisError) {
        let _ = self.refusal.set(error.to_string());
        self.mark_lost(cause);
    }

    /// The outermost holder released (or dropped) the lock: handles that
    /// outlive it see it as no longer held. Not an error, so not logged.
    pub(crate) fn mark_released(&self) {
        let _ = self.lost.compare_exchange(
            0,
            LostCause::Released.code(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.stop_holding();
        self.wake();
    }

    pub(crate) fn mark_max_hold_reached(&self) {
        self.max_hold_reached.store(true, Ordering::Release);
    }

    /// Why the lock is lost, if it is: a recorded cause, or the validity
    /// deadline having passed at `now` without a confirmed renewal. For a
    /// renewed lock a loss, once seen, is recorded and final: a renewal
    /// confirmed later does not make the lock held again.
    pub(crate) fn lost_cause(&self, now: Instant) -> Option<LostCause> {
        if let Some(cause) = self.reported_loss() {
            return Some(cause);
        }

        if now < self.valid_until() {
            return None;
        }
        if !self.renewed {
            // A fixed lease: its ttl has (probably) run out; its release will
            // tell for sure.
            return Some(LostCause::Expired);
        }
        self.mark_lost(if self.max_hold_reached.load(Ordering::Acquire) {
            LostCause::MaxHold
        } else {
            LostCause::NotRenewed
        });
        self.reported_loss()
    }

    /// The recorded loss, if any.
    pub(crate) fn reported_loss(&self) -> Option<LostCause> {
        match self.lost.load(Ordering::Acquire) {
            0 => None,
            code => Some(LostCause::from_code(code)),
        }
    }

    /// When the loss was recorded, if it was (simulation only).
    #[cfg(feature = "simulation")]
    pub(crate) fn lost_at(&self) -> Option<Instant> {
        self.lost_at.get().copied()
    }

    /// The hold was handed to its holder by another task of the client
    /// (simulation only).
    #[cfg(feature = "simulation")]
    pub(crate) fn mark_passed_in_process(&self) {
        self.passed_in_process.store(true, Ordering::Relaxed);
    }

    /// Whether [`mark_passed_in_process`](Self::mark_passed_in_process)
    /// was called (simulation only).
    #[cfg(feature = "simulation")]
    pub(crate) fn passed_in_process(&self) -> bool {
        self.passed_in_process.load(Ordering::Relaxed)
    }

    pub(crate) fn is_held(&self) -> bool {
        self.lost_cause(Instant::now()).is_none()
    }

    pub(crate) fn remaining(&self) -> Duration {
        if self.lost.load(Ordering::Acquire) != 0 {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// A wake-up, registered now, for the next loss or release.
    /// (Callers check for a loss after registering, so a loss recorded
    /// before the signal existed is seen too.)
    pub(crate) fn loss_signal(&self) -> Pin<Box<OwnedNotified>> {
        let signal = self.lost_signal.get_or_init(|| Arc::new(Notify::new()));
        let mut notified = Box::pin(Arc::clone(signal).notified_owned());
        notified.as_mut().enable();
        notified
    }

    fn wake(&self) {
        if let Some(signal) = self.lost_signal.get() {
            signal.notify_waiters();
        }
    }
}
