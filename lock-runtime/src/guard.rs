//! A held lock: its release, its renewal registration, and running a body
//! under it.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::acquire::FENCE_RETENTION;
use crate::cohort::{Next, Passed, Waiter};
use crate::error::{LockError, LostCause};
use crate::hold::{drift_margin, Acquired, Hold};
use crate::renewal::Registration;
use crate::scripts::{evalsha, run, HANDOFF, RELEASE, RELEASE_KEEPING};
use crate::token::new_token;
use crate::watch::{watch, HeldLock, Scope};

/// What to do with the body when a renewed lock is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Drop the body's future (it is cancelled at its next await point) and
    /// return [`LockError::Lost`]. The default.
    #[default]
    Stop,
    /// Let the body run to its end and return its output; the loss is logged
    /// at error level. Unsafe for mutual exclusion: after the loss another
    /// holder may run at the same time as the rest of the body.
    Continue,
}

/// Compare-and-delete (or, with `hold_at_least`, compare-and-keep), and wake
/// the waiter the lock's mark names: one EVALSHA round trip on the lock key
/// alone, retried on a fresh connection within the call's deadline.
///
/// `may_have_run`: an earlier release of this hold failed without an answer
/// and may have run in Redis. Then, as for a retry within this call, finding
/// the key gone or another holder's token in it while the lock was still
/// valid means that earlier release did its work: not a loss.
async fn release(hold: &Hold, may_have_run: bool) -> Result<(), LockError> {
    let keep_ms = hold.keep_for().as_millis() as u64;
    // Only the lock key: the wake mark in its value names the waiter to wake.
    let script = if keep_ms > 0 {
        &*RELEASE_KEEPING
    } else {
        &*RELEASE
    };
    let mut cmd = evalsha(script, 1, 3, hold.keys.lock.len() + hold.token.len() + 20);
    cmd.arg(&hold.keys.lock).arg(&hold.token);
    if keep_ms > 0 {
        cmd.arg(keep_ms);
    }
    let outcome: i64 = hold
        .client
        .call(hold.name(), "release", |mut connection, attempt| {
            let cmd = &cmd;
            async move {
                let sent_at = Instant::now();
                let code: i64 = run(script, cmd, &mut connection, hold.client.scripts()).await?;
                let earlier_may_have_run = may_have_run || attempt > 0;
                Ok(
                    if code <= 0 && earlier_may_have_run && sent_at < hold.valid_until() {
                        1
                    } else {
                        code
                    },
                )
            }
        })
        .await?;
    let lost = |cause| LockError::Lost {
        key: hold.name().to_owned(),
        cause,
    };
    match outcome {
        1 | 2 => {
            tracing::debug!(lock = %hold.name(), "released");
            if outcome == 2 {
                hold.client.handed_over(&hold.keys.lock);
            }
            Ok(())
        }
        0 => Err(lost(LostCause::Expired)),
        _ => Err(lost(LostCause::TakenOver)),
    }
}

/// The first pause between background release attempts, doubled up to
/// [`MAX_RELEASE_PAUSE`].
const FIRST_RELEASE_PAUSE: Duration = Duration::from_millis(20);
const MAX_RELEASE_PAUSE: Duration = Duration::from_secs(1);

/// Releases in a background task on the current Tokio runtime, trying again
/// after failures for as long as the lock could still be held (its key
/// cannot outlive the last confirmed acquire or renewal by more than its
/// ttl). Logs only what nobody is told otherwise: a release that succeeded
/// after failures, and one given up.
///
/// `may_have_run`: an earlier release of this hold may have run (see
/// [`release`]).
pub(crate) fn spawn_release(hold: Arc<Hold>, may_have_run: bool) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            lock = %hold.name(),
            "lock guard dropped outside a Tokio runtime; the lock frees itself when its ttl passes"
        );
        return;
    };
    runtime.spawn(async move {
        let until = hold.valid_until() + drift_margin(hold.ttl) + hold.client.call_deadline();
        let mut may_have_run = may_have_run;
        let mut pause = FIRST_RELEASE_PAUSE;
        let mut failures = 0u32;
        loop {
            match release(&hold, may_have_run).await {
                Ok(()) | Err(LockError::Lost { .. }) => {
                    if failures > 0 {
                        tracing::info!(lock = %hold.name(), failures, "released after failed attempts");
                    }
                    if hold.linger {
                        linger(&hold, until).await;
                    }
                    return;
                }
                Err(error) => {
                    failures += 1;
                    may_have_run = true;
                    if Instant::now() + pause >= until {
                        tracing::warn!(
                            lock = %hold.name(), %error, failures,
                            "release failed and is given up: the lock frees itself when its ttl passes"
                        );
                        return;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RELEASE_PAUSE);
                }
            }
        }
    });
}

/// After the release of an acquisition one of whose attempts timed out: a
/// copy of that attempt, stuck in the replaced connection, may still reach
/// Redis and take the lock with this token, for nobody. The token is never
/// used again, so deleting it is always safe: check for it now and then
/// while such a lock could matter.
async fn linger(hold: &Hold, until: Instant) {
    let mut pause = Duration::from_millis(100);
    while Instant::now() + pause < until {
        tokio::time::sleep(pause).await;
        let _ = release(hold, true).await;
        pause = (pause * 2).min(MAX_RELEASE_PAUSE);
    }
}

/// The release of a holder in its client's cohort (`cohort.rs`) of this
/// generation: passes the lock to the next task of its client waiting for
/// it, with one `HANDOFF` (the next holder's own token and ttl); or, when
/// others wait in Redis and had their share, releases it and then ends the
/// cohort; or, with nobody waiting here, releases it.
fn pass_or_release(hold: Arc<Hold>, generation: u64) -> BoxFuture<'static, Result<(), LockError>> {
    Box::pin(async move {
        match next_step(&hold, generation) {
            Next::Pass(waiter) => pass_to(hold, generation, waiter).await,
            Next::Release => release_then_dissolve(&hold, generation).await,
            Next::Alone => release(&hold, false).await,
        }
    })
}

/// What a cohort holder's release does; a kept lock (`hold_at_least`) is
/// never passed on.
fn next_step(hold: &Hold, generation: u64) -> Next {
    let cohorts = hold.client.cohorts();
    if hold.keep_for().is_zero() {
        cohorts.next(&hold.keys.lock, generation)
    } else {
        Next::Release
    }
}

/// Releases through Redis, then ends the cohort: its waiters stay queued
/// until the release is done, so that none of them races the waiter of
/// another client the release wakes (and, within the hand-over window, they
/// queue behind it).
async fn release_then_dissolve(hold: &Hold, generation: u64) -> Result<(), LockError> {
    let result = release(hold, false).await;
    hold.client.cohorts().dissolve(&hold.keys.lock, generation);
    result
}

/// Ends a cohort if dropped before [`disarm`](DissolveOnDrop::disarm): a
/// task carrying the cohort on that is dropped unfinished (its runtime
/// shutting down) must not leave its waiters queued for nothing.
struct DissolveOnDrop {
    hold: Arc<Hold>,
    generation: u64,
    armed: bool,
}

impl DissolveOnDrop {
    fn new(hold: &Arc<Hold>, generation: u64) -> Self {
        DissolveOnDrop {
            hold: Arc::clone(hold),
            generation,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for DissolveOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let hold = &self.hold;
            hold.client
                .cohorts()
                .dissolve(&hold.keys.lock, self.generation);
        }
    }
}

/// [`pass_or_release`] in the background, for a dropped guard or a lock
/// nobody holds: a release that fails goes on in the background, and one
/// after a timed-out attempt lingers.
pub(crate) fn pass_on(hold: Arc<Hold>, generation: u64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        hold.client.cohorts().dissolve(&hold.keys.lock, generation);
        spawn_release(hold, false); // logs that the ttl frees it
        return;
    };
    let dissolve = DissolveOnDrop::new(&hold, generation);
    runtime.spawn(async move {
        let result = pass_or_release(Arc::clone(&hold), generation).await;
        dissolve.disarm();
        match result {
            Err(LockError::Redis { .. }) => spawn_release(hold, true),
            _ if hold.linger => spawn_release(hold, true),
            _ => {}
        }
    });
}

/// Passes `hold`'s lock to `waiter` (see [`pass_or_release`]).
fn pass_to(
    hold: Arc<Hold>,
    generation: u64,
    waiter: Waiter,
) -> BoxFuture<'static, Result<(), LockError>> {
    Box::pin(async move {
        let client = hold.client.clone();
        let cohorts = client.cohorts();
        let key = &hold.keys.lock;
        let token = match new_token() {
            Ok(token) => token,
            Err(error) => {
                let _ = waiter.send(Passed::Redis);
                cohorts.dissolve(key, generation);
                release(&hold, false).await?;
                return Err(error);
            }
        };
        let ttl_ms = waiter.ttl_ms;
        let sent_at = Instant::now();
        let next = |linger| {
            Hold::new(Acquired {
                client: client.clone(),
                keys: hold.keys.clone(),
                token: token.clone(),
                ttl: Duration::from_millis(ttl_ms),
                renewed: false,
                sent_at,
                confirmed_at: Instant::now(),
                fencing_token: None,
                hold_at_least: None,
                stop_on_loss: false,
                linger,
                expires_by: None,
            })
        };
        match handoff(&hold, &token, &waiter).await {
            Ok((fence, queued)) => {
                cohorts.passed(key, generation, queued);
                let passed = Passed::Lock {
                    token: token.clone(),
                    sent_at,
                    fence,
                };
                if waiter.send(passed).is_err() {
                    // The waiter gave up meanwhile: the lock holds a token
                    // nobody has; pass it on, or release it.
                    let orphan = next(false);
                    cohorts.holds(key, generation, &orphan);
                    pass_on(orphan, generation);
                }
                Ok(())
            }
            Err(error) => {
                let _ = waiter.send(Passed::Redis);
                cohorts.dissolve(key, generation);
                if let LockError::Redis { .. } = error {
                    // Unknown outcome: the key may hold the next token.
                    spawn_release(next(true), true);
                }
                Err(error)
            }
        }
    })
}

/// One `HANDOFF` round trip: the lock goes from `hold` to `next`, with the
/// waiter's ttl and, when it asks, a fencing token. Returns the fencing
/// token and whether waiters of other clients are queued in Redis.
async fn handoff(
    hold: &Hold,
    next: &str,
    waiter: &Waiter,
) -> Result<(Option<u64>, bool), LockError> {
    let retention_ms = if waiter.fencing {
        (FENCE_RETENTION.as_millis() as u64).max(waiter.ttl_ms)
    } else {
        0
    };
    let mut cmd = evalsha(
        &HANDOFF,
        2,
        6,
        2 * hold.keys.lock.len() + hold.token.len() + next.len() + 48,
    );
    cmd.arg(&hold.keys.lock)
        .arg(hold.keys.fence())
        .arg(&hold.token)
        .arg(next)
        .arg(waiter.ttl_ms)
        .arg(retention_ms);
    let scripts = hold.client.scripts();
    let reply: Vec<i64> = hold
        .client
        .call(hold.name(), "hand-off", |mut connection, _| {
            let cmd = &cmd;
            async move { run(&HANDOFF, cmd, &mut connection, scripts).await }
        })
        .await?;
    let lost = |cause| LockError::Lost {
        key: hold.name().to_owned(),
        cause,
    };
    match reply.first() {
        Some(1) => Ok((
            waiter
                .fencing
                .then(|| reply.get(1).copied().unwrap_or(0) as u64),
            reply.get(2) == Some(&1),
        )),
        Some(0) => Err(lost(LostCause::Expired)),
        _ => Err(lost(LostCause::TakenOver)),
    }
}

/// A held lock. Release it with [`release`](LockGuard::release); a guard that
/// is dropped without it (early return, `?`, panic, cancelled future)
/// releases in a background task on the current Tokio runtime. Renewals (for
/// a lock taken with [`renew`](crate::Lock::renew)) stop before the release
/// is sent, and never resume.
///
/// Dereferences to [`HeldLock`] for the lock's name, token and validity.
#[must_use = "a lock guard is released as soon as it is dropped"]
pub struct LockGuard {
    lock: HeldLock,
    renewal: Option<Registration>,
    /// Until `release` completes, dropping the guard releases the lock.
    armed: bool,
    /// A release was sent and may have run (it was cancelled).
    releasing: bool,
    /// Shares a hold taken further up this task's call chain, whose scope's
    /// entry permit it holds: the outermost holder releases.
    reentrant: Option<Arc<Scope>>,
    /// Holds the lock for its client's cohort (`cohort.rs`) of this
    /// generation: its release passes the lock to the next waiting task of
    /// its client, if any.
    pub(crate) cohort: Option<u64>,
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>, renewal: Option<Registration>) -> Self {
        LockGuard {
            lock: HeldLock { hold },
            renewal,
            armed: true,
            releasing: false,
            reentrant: None,
            cohort: None,
        }
    }

    /// A guard for a lock already held up this task's call chain, holding
    /// `scope`'s entry permit: it shares the outer hold, and its release and
    /// its drop only give the permit back.
    pub(crate) fn reentrant(scope: Arc<Scope>) -> Self {
        LockGuard {
            lock: HeldLock {
                hold: Arc::clone(scope.hold()),
            },
            renewal: None,
            armed: false,
            releasing: false,
            reentrant: Some(scope),
            cohort: None,
        }
    }

    /// Whether this guard re-entered a lock its task already held.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant.is_some()
    }

    fn hold(&self) -> &Arc<Hold> {
        &self.lock.hold
    }

    pub(crate) fn held(&self) -> &Arc<Hold> {
        &self.lock.hold
    }

    /// Runs `body` under this lock, without releasing it afterwards.
    ///
    /// Inside, [`current()`](crate::current) returns this lock. For a renewed
    /// lock with [`OnLost::Stop`] (the default), `body` is dropped, unpolled,
    /// as soon as the lock is lost (a renewal found it gone, or its validity
    /// ran out without a confirmed renewal) and this returns
    /// [`LockError::Lost`]. Otherwise `body` runs to its end.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let hold = Arc::clone(self.hold());
        let stop_on_loss = hold.stop_on_loss;
        watch(hold, stop_on_loss, self.is_reentrant(), body)
            .await
            .map_err(|cause| LockError::Lost {
                key: self.hold().name().to_owned(),
                cause,
            })
    }

    /// Waits until the lock is lost (never returns while it is held). For a
    /// `select!` against other work.
    pub async fn lost(&self) -> LostCause {
        match watch(
            Arc::clone(self.hold()),
            true,
            false,
            std::future::pending::<std::convert::Infallible>(),
        )
        .await
        {
            Err(cause) => cause,
            Ok(never) => match never {},
        }
    }

    /// Releases the lock in one round trip, after stopping its renewals.
    ///
    /// Returns [`LockError::Lost`] if the key had expired or another holder
    /// had taken it; the other holder's lock is left untouched. If this
    /// future is dropped before it completes, the guard is dropped with it
    /// and the release goes on in the background: a cancelled release never
    /// leaves the lock held until its ttl.
    pub async fn release(mut self) -> Result<(), LockError> {
        if let Some(scope) = self.reentrant.take() {
            scope.leave();
            // The outermost holder releases; if it already has, this entry
            // outlived it.
            return match self.hold().reported_loss() {
                Some(LostCause::Released) => Err(LockError::Lost {
                    key: self.hold().name().to_owned(),
                    cause: LostCause::Released,
                }),
                _ => Ok(()),
            };
        }
        self.renewal.take();
        let hold = Arc::clone(self.hold());
        self.releasing = true;
        let loss = hold.reported_loss();
        // Before the release is sent: a reentrant body that escaped the
        // outer one (its future polled elsewhere) stops now, not when the
        // reply comes back, by which time another holder may have the key.
        hold.mark_released();
        if let (Some(generation), Some(_)) = (self.cohort, loss) {
            hold.client.cohorts().dissolve(&hold.keys.lock, generation);
        }
        let result = match loss {
            // A renewal found the key gone or another's: nothing to delete.
            Some(cause @ (LostCause::Expired | LostCause::TakenOver)) => Err(LockError::Lost {
                key: hold.name().to_owned(),
                cause,
            }),
            // Lost by the clock (the holder was told and stopped): the key
            // may still hold our token, so delete it, and report the loss.
            Some(cause) => match release(&hold, false).await {
                Ok(()) => Err(LockError::Lost {
                    key: hold.name().to_owned(),
                    cause,
                }),
                Err(error) => Err(error),
            },
            None if self.cohort.is_some() => {
                let generation = self.cohort.unwrap_or_default();
                match next_step(&hold, generation) {
                    // In its own task, so that a cancelled `release()` cannot
                    // stop a hand-off halfway (the next holder would never be
                    // told); the cohort ends if that task is dropped unrun.
                    Next::Pass(waiter) => {
                        let dissolve = DissolveOnDrop::new(&hold, generation);
                        let passing = pass_to(Arc::clone(&hold), generation, waiter);
                        tokio::spawn(async move {
                            let result = passing.await;
                            dissolve.disarm();
                            result
                        })
                        .await
                        .unwrap_or_else(|_| {
                            Err(LockError::config(
                                "the hand-off task was cancelled (its runtime is shutting \
                                 down); the lock frees itself when its ttl passes",
                            ))
                        })
                    }
                    Next::Release => {
                        // A cancelled release ends the cohort in Drop.
                        let result = release(&hold, false).await;
                        hold.client.cohorts().dissolve(&hold.keys.lock, generation);
                        self.cohort = None;
                        result
                    }
                    Next::Alone => {
                        self.cohort = None; // a cancelled release is a plain one
                        release(&hold, false).await
                    }
                }
            }
            None => release(&hold, false).await,
        };
        // Only now is the guard disarmed: a cancelled release above drops
        // `self` still armed, and Drop releases in the background.
        self.armed = false;
        match result {
            Ok(()) | Err(LockError::Lost { .. }) if hold.linger => {
                spawn_release(Arc::clone(&hold), true);
                result
            }
            Err(LockError::Redis { key, source, .. }) => {
                // Still ours, maybe: keep trying while it could be held.
                spawn_release(hold, true);
                Err(LockError::Redis {
                    key,
                    operation: "release (retried in the background until the lock's ttl passes)",
                    source,
                })
            }
            result => result,
        }
    }
}

impl Deref for LockGuard {
    type Target = HeldLock;

    fn deref(&self) -> &HeldLock {
        &self.lock
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(scope) = self.reentrant.take() {
            scope.leave();
            return;
        }
        self.renewal.take();
        if self.armed {
            let hold = Arc::clone(self.hold());
            hold.mark_released();
            match self.cohort {
                None => spawn_release(hold, self.releasing),
                Some(generation) if self.releasing => {
                    // A cancelled `release()`: a hand-off goes on in its own
                    // task; anything else is released here.
                    hold.client.cohorts().dissolve(&hold.keys.lock, generation);
                    spawn_release(hold, true);
                }
                Some(generation) => pass_on(hold, generation),
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("armed", &self.armed)
            .field("reentrant", &self.is_reentrant())
            .finish()
    }
}
