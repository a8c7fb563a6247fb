//! A held lock: its release, its renewal registration, and running a body
//! under it.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use crate::error::{LockError, LostCause};
use crate::hold::Hold;
use crate::renewal::Registration;
use crate::scripts::{evalsha, run, RELEASE, RELEASE_KEEPING};
use crate::watch::{watch, HeldLock};

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

/// Compare-and-delete (or, with `hold_at_least`, compare-and-shorten), and
/// wake the waiter the lock's mark names: one EVALSHA round trip on the lock
/// key alone.
async fn release(hold: &Hold) -> Result<(), LockError> {
    let mut connection = hold.client.connection();
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
        .call(hold.name(), "release", run(script, &cmd, &mut connection))
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

/// Releases in a background task on the current Tokio runtime.
pub(crate) fn spawn_release(hold: Arc<Hold>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                match release(&hold).await {
                    Ok(()) | Err(LockError::Lost { .. }) => {}
                    Err(error) => tracing::warn!(
                        lock = %hold.name(), %error,
                        "background release failed; the lock frees itself when its ttl passes"
                    ),
                }
            });
        }
        Err(_) => tracing::warn!(
            lock = %hold.name(),
            "lock guard dropped outside a Tokio runtime; the lock frees itself when its ttl passes"
        ),
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
    /// Shares a hold taken further up this task's call chain: the outermost
    /// holder releases.
    reentrant: bool,
}

impl LockGuard {
    pub(crate) fn new(hold: Arc<Hold>, renewal: Option<Registration>) -> Self {
        LockGuard {
            lock: HeldLock { hold },
            renewal,
            armed: true,
            reentrant: false,
        }
    }

    /// A guard for a lock already held up this task's call chain: it shares
    /// the outer hold, and neither its release nor its drop does anything.
    pub(crate) fn reentrant(hold: Arc<Hold>) -> Self {
        LockGuard {
            lock: HeldLock { hold },
            renewal: None,
            armed: false,
            reentrant: true,
        }
    }

    /// Whether this guard re-entered a lock its task already held.
    pub fn is_reentrant(&self) -> bool {
        self.reentrant
    }

    fn hold(&self) -> &Arc<Hold> {
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
        watch(Arc::clone(self.hold()), self.hold().stop_on_loss, body)
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
        if self.reentrant {
            return Ok(()); // the outermost holder releases
        }
        self.renewal.take();
        let hold = Arc::clone(self.hold());
        let result = match hold.reported_loss() {
            // A renewal found the key gone or another's: nothing to delete.
            Some(cause @ (LostCause::Expired | LostCause::TakenOver)) => Err(LockError::Lost {
                key: hold.name().to_owned(),
                cause,
            }),
            // Lost by the clock (the holder was told and stopped): the key
            // may still hold our token, so delete it, and report the loss.
            Some(cause) => match release(&hold).await {
                Ok(()) => Err(LockError::Lost {
                    key: hold.name().to_owned(),
                    cause,
                }),
                Err(error) => Err(error),
            },
            None => release(&hold).await,
        };
        // Only now is the guard disarmed: a cancelled release above drops
        // `self` still armed, and Drop releases in the background.
        self.armed = false;
        hold.mark_released();
        result
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
        self.renewal.take();
        if self.armed {
            let hold = Arc::clone(self.hold());
            spawn_release(Arc::clone(&hold));
            hold.mark_released();
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("armed", &self.armed)
            .finish()
    }
}
