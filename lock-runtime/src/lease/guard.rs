//! A held lock: its release, its renewal registration, and running a body
//! under it.

use crate::backend::Kind;
use crate::error::{ConfigError, LockError, LostCause};
use crate::lease::cohort::Next;
use crate::lease::hold::Hold;
use crate::lease::local_handoff::{next_step, pass_on, pass_to, DissolveOnDrop};
use crate::lease::release::{release, spawn_release};
use crate::lease::renewal::Registration;
use crate::lease::watch::{watch, Entered, HeldLock, Scope};
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

/// What to do with the body when a renewed lock is lost.
///
/// ```no_run
/// # async fn rebalance() {}
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::{Lock, OnLost};
///
/// // The body only moves data it can move twice: finish it even if the
/// // lock is lost (the loss is logged at warn). The attribute's
/// // `on_lost = "continue"`.
/// Lock::new("rebalance")
///     .ttl(Duration::from_secs(10))
///     .renew()
///     .on_lost(OnLost::Continue)
///     .run(rebalance())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Drop the body's future (it is cancelled at its next await point) and
    /// return [`LockError::Lost`]. The default.
    #[default]
    Stop,
    /// Let the body run to its end and return its output; the loss is logged
    /// at warn level (once, in the `lock.hold` span) as soon as it is seen, while the body runs on.
    /// Unsafe for mutual exclusion: after the loss another
    /// holder may run at the same time as the rest of the body.
    Continue,
}

/// A held lock. Release it with [`release`](LockGuard::release); a guard that
/// is dropped without it (early return, `?`, panic, cancelled future)
/// releases in a background task on the current Tokio runtime. Renewals (for
/// a lock taken with [`renew`](crate::Lock::renew)) stop before the release
/// is sent, and never resume.
///
/// Dereferences to [`HeldLock`] for the lock's name, token and validity.
///
/// ```no_run
/// # async fn write_invoice(_: u64, _: Option<u64>) {}
/// # async fn build_report() -> usize { 0 }
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::Lock;
///
/// let guard = Lock::new("invoice:7").ttl(Duration::from_secs(10)).fencing().acquire().await?;
/// write_invoice(7, guard.fencing_token()).await; // `HeldLock`'s methods, through `Deref`
/// guard.release().await?; // `Err(LockError::Lost { .. })` if it expired meanwhile
///
/// // Renewed: `run` stops the body if the lock is lost.
/// let guard = Lock::new("report").ttl(Duration::from_secs(10)).renew().acquire().await?;
/// let rows = guard.run(build_report()).await?;
/// guard.release().await?;
/// # let _ = rows; Ok(()) }
/// ```
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
    reentrant: Option<(Arc<Scope>, Entered)>,
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
    /// `scope`'s entry permits: it shares the outer hold, and its release
    /// and its drop only give the permits back.
    pub(crate) fn reentrant(scope: Arc<Scope>, entered: Entered) -> Self {
        LockGuard {
            lock: HeldLock {
                hold: Arc::clone(scope.hold()),
            },
            renewal: None,
            armed: false,
            releasing: false,
            reentrant: Some((scope, entered)),
            cohort: None,
        }
    }

    /// Whether this guard re-entered a lock its task already held.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant.is_some()
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.lock.hold
    }

    /// Whether this guard holds a read share or a read entry of a write.
    fn reads(&self) -> bool {
        self.hold().kind == Kind::Read
            || self
                .reentrant
                .as_ref()
                .is_some_and(|(_, entered)| entered.is_shared())
    }

    /// Runs `body` under this lock, without releasing it afterwards.
    ///
    /// Inside, [`current()`](crate::current) returns this lock. For a renewed
    /// lock with [`OnLost::Stop`] (the default), `body` is dropped, unpolled,
    /// as soon as the lock is lost (a renewal found it gone, or its validity
    /// ran out without a confirmed renewal) and this returns
    /// [`LockError::Lost`]. Otherwise `body` runs to its end.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock was lost and `body` stopped.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `body`; the guard, and the lock, stay held.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let span = self.hold_span();
        let result = self.run_in(&span, body).await;
        if result.is_ok() {
            // The body is done; this guard still holds the lock.
            span.record("lock.outcome", "done");
        }
        result
    }

    /// The `lock.hold` span of a body run under this lock: every event of
    /// the body carries the lock's name (and fencing token); when the hold
    /// ends it records how (`lock.outcome`: `released`, `lost` with
    /// `lock.lost_cause`, `error`, or `done` for a body whose guard still
    /// holds the lock).
    pub(crate) fn hold_span(&self) -> tracing::Span {
        let hold = self.hold();
        let span = tracing::info_span!(
            "lock.hold",
            lock.name = %hold.name(),
            lock.holder = %hold.token_head(),
            lock.fencing_token = tracing::field::Empty,
            lock.outcome = tracing::field::Empty,
            lock.lost_cause = tracing::field::Empty,
        );
        if let Some(token) = hold.fencing_token {
            span.record("lock.fencing_token", token);
        }
        span
    }

    /// [`run`](LockGuard::run) in `span`. A loss is recorded in the span
    /// and logged once, at warn, inside it.
    pub(crate) async fn run_in<F: Future>(
        &self,
        span: &tracing::Span,
        body: F,
    ) -> Result<F::Output, LockError> {
        let hold = Arc::clone(self.hold());
        let stop_on_loss = hold.stop_on_loss;
        let watched = watch(hold, stop_on_loss, self.is_reentrant(), self.reads(), body);
        in_span!(span, watched).map_err(|cause| {
            lost_in(span, self.hold(), cause);
            LockError::Lost {
                name: self.hold().name().to_owned(),
                cause,
            }
        })
    }

    /// Waits until the lock is lost (never returns while it is held). For a
    /// `select!` against other work.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches; dropping it changes nothing.
    pub async fn lost(&self) -> LostCause {
        match watch(
            Arc::clone(self.hold()),
            true,
            false,
            self.reads(),
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
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`]: the key had expired or was another holder's.
    /// - [`LockError::Redis`]: Redis did not confirm the release; it goes on
    ///   in the background for as long as the lock could still be held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped release still releases, in the background.
    pub async fn release(self) -> Result<(), LockError> {
        let span = tracing::info_span!(
            "lock.release",
            lock.name = %self.hold().name(),
            lock.outcome = tracing::field::Empty,
        );
        let hold = Arc::clone(self.hold());
        let outermost = self.reentrant.is_none();
        let result = in_span!(span, self.release_bounded());
        match &result {
            Ok(()) if outermost => {
                crate::observe::hold_ended(hold.label(), "released", hold.acquired_at.elapsed())
            }
            Err(LockError::Lost { cause, .. }) if outermost => {
                span.in_scope(|| hold.count_loss(*cause))
            }
            _ => {}
        }
        span.record(
            "lock.outcome",
            match &result {
                Ok(()) => "released",
                Err(LockError::Lost { .. }) => "lost",
                Err(_) => "error",
            },
        );
        result
    }

    /// [`release_traced`](Self::release_traced), within one call deadline
    /// (§9) for a holder in its client's cohort: its release may first wait
    /// for the outcome of the `HANDOFF` that passed it the lock, and may pass
    /// the lock on with a `HANDOFF` sent again until Redis answers (§4), each
    /// up to the lock's validity. Past the deadline a task finishes the
    /// release as it would have gone on (nothing is sent with the token
    /// before the pass's outcome is in), and the caller is told so. Other releases are one backend call, under its deadline.
    async fn release_bounded(self) -> Result<(), LockError> {
        if self.cohort.is_none() || self.reentrant.is_some() {
            return self.release_traced().await;
        }
        let hold = Arc::clone(self.hold());
        let deadline = hold.core.call_deadline();
        // Boxed: rare to outlive the deadline, and then moved to a task
        // that finishes it (not dropped: a pass whose outcome is open is
        // settled as the release would have).
        let mut release = Box::pin(self.release_traced());
        match tokio::time::timeout(deadline, &mut release).await {
            Ok(result) => result,
            Err(_) => {
                drop(tokio::spawn(release));
                Err(LockError::redis(
                    hold.name(),
                    "release (retried in the background until the lock's ttl passes)",
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                        "no answer within {deadline:?} to the hand-off that passed this lock in \
                         the process or passes it on"
                    ),
                    )
                    .into(),
                ))
            }
        }
    }

    async fn release_traced(mut self) -> Result<(), LockError> {
        if let Some((scope, entered)) = self.reentrant.take() {
            scope.leave(entered);
            // The outermost holder releases; if it already has, this entry
            // outlived it.
            return match self.hold().reported_loss() {
                Some(LostCause::Released) => Err(LockError::Lost {
                    name: self.hold().name().to_owned(),
                    cause: LostCause::Released,
                }),
                _ => Ok(()),
            };
        }
        self.renewal.take();
        let hold = Arc::clone(self.hold());
        // A lock passed early: its pass's outcome first, so that a refusal
        // is seen as the loss it is, and the next decision counts it.
        hold.settled().await;
        self.releasing = true;
        let loss = hold.reported_loss();
        // Before the release is sent: a reentrant body that escaped the
        // outer one (its future polled elsewhere) stops now, not when the
        // reply comes back, by which time another holder may have the key.
        hold.mark_released();
        if let (Some(generation), Some(_)) = (self.cohort, loss) {
            hold.core.cohorts().dissolve(&hold.keys.lock, generation);
        }
        let result = match loss {
            // A renewal found the key gone or another's: nothing to delete.
            // (A pass refused found it so too; what it may have written on a
            // quorum's minority is given back by the pass, `local_handoff.rs`.)
            Some(
                cause @ (LostCause::Expired
                | LostCause::TakenOver
                | LostCause::Deleted
                | LostCause::Replaced),
            ) => Err(LockError::Lost {
                name: hold.name().to_owned(),
                cause,
            }),
            // Lost by the clock or by a refused renewal (the holder was
            // told and stopped): the key may still hold our token, so
            // delete it, and report the loss as it was first seen.
            Some(cause) => match release(&hold, false).await {
                Ok(()) | Err(LockError::Lost { .. }) => Err(LockError::Lost {
                    name: hold.name().to_owned(),
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
                    //
                    // The guard is disarmed first: the pass takes care of
                    // the token (the next holder may already run under it,
                    // so a cancelled `release()` must not release it).
                    Next::Pass(waiter) => {
                        self.armed = false;
                        self.cohort = None;
                        let dissolve = DissolveOnDrop::new(&hold, generation);
                        let passing = pass_to(Arc::clone(&hold), generation, waiter);
                        return tokio::spawn(async move {
                            let result = passing.await;
                            dissolve.disarm();
                            result
                        })
                        .await
                        .unwrap_or_else(|_| {
                            Err(ConfigError::RuntimeShutDown {
                                name: hold.name().to_owned(),
                            }
                            .into())
                        });
                    }
                    Next::Release => {
                        // A cancelled release ends the cohort in Drop.
                        let result = release(&hold, false).await;
                        hold.core.cohorts().dissolve(&hold.keys.lock, generation);
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
        if result.is_ok() && !hold.linger() {
            crate::lease::release::keep_recorded(Arc::clone(&hold));
        }
        match result {
            Ok(()) | Err(LockError::Lost { .. }) if hold.linger() => {
                spawn_release(Arc::clone(&hold), true);
                result
            }
            Err(LockError::Redis {
                name,
                server,
                source,
                ..
            }) => {
                // Still ours, maybe: keep trying while it could be held.
                spawn_release(hold, true);
                Err(LockError::Redis {
                    name,
                    operation: "release (retried in the background until the lock's ttl passes)",
                    server,
                    source,
                })
            }
            result => result,
        }
    }
}

/// Records in `span` (a `lock.hold` span) that the hold was lost, and logs
/// it there once (with its metric).
pub(crate) fn lost_in(span: &tracing::Span, hold: &Hold, cause: LostCause) {
    span.record("lock.outcome", "lost");
    span.record("lock.lost_cause", cause.label());
    span.in_scope(|| hold.count_loss(cause));
}

impl Deref for LockGuard {
    type Target = HeldLock;

    fn deref(&self) -> &HeldLock {
        &self.lock
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some((scope, entered)) = self.reentrant.take() {
            scope.leave(entered);
            return;
        }
        self.renewal.take();
        if self.armed {
            let hold = Arc::clone(self.hold());
            if let Some(cause) = hold.reported_loss() {
                // Lost and dropped (a body stopped, a `select!` on
                // `lost()`): the holder has heard of it, the log has not.
                hold.count_loss(cause);
            }
            hold.mark_released();
            match self.cohort {
                None => spawn_release(hold, self.releasing),
                Some(generation) if self.releasing => {
                    // A cancelled `release()`: a hand-off goes on in its own
                    // task; anything else is released here.
                    hold.core.cohorts().dissolve(&hold.keys.lock, generation);
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
