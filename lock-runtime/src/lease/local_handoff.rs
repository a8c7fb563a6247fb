//! The release of a holder in its client's cohort (`cohort.rs`): the lock
//! passed to the next waiting task of the client with one `HANDOFF`, or
//! released through Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use crate::backend::{Found, Pass};
use crate::error::{LockError, LostCause};
use crate::lease::cohort::{Next, Passed, Waiter};
use crate::lease::hold::{fence_retention_ms, Acquired, Hold};
use crate::lease::release::{release, spawn_release};

use crate::token::new_token;

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
pub(crate) fn next_step(hold: &Hold, generation: u64) -> Next {
    let cohorts = hold.core.cohorts();
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
    hold.core.cohorts().dissolve(&hold.keys.lock, generation);
    result
}

/// Ends a cohort if dropped before [`disarm`](DissolveOnDrop::disarm): a
/// task carrying the cohort on that is dropped unfinished (its runtime
/// shutting down) must not leave its waiters queued for nothing.
pub(crate) struct DissolveOnDrop {
    hold: Arc<Hold>,
    generation: u64,
    armed: bool,
}

impl DissolveOnDrop {
    pub(crate) fn new(hold: &Arc<Hold>, generation: u64) -> Self {
        DissolveOnDrop {
            hold: Arc::clone(hold),
            generation,
            armed: true,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for DissolveOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let hold = &self.hold;
            hold.core
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
        hold.core.cohorts().dissolve(&hold.keys.lock, generation);
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
pub(crate) fn pass_to(
    hold: Arc<Hold>,
    generation: u64,
    waiter: Waiter,
) -> BoxFuture<'static, Result<(), LockError>> {
    Box::pin(async move {
        let core = Arc::clone(&hold.core);
        let cohorts = core.cohorts();
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
                core: Arc::clone(&core),
                kind: hold.kind,
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
        match handoff(&hold, &token, ttl_ms, waiter.fencing).await {
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
    ttl_ms: u64,
    fencing: bool,
) -> Result<(Option<u64>, bool), LockError> {
    let retention_ms = fencing.then(|| fence_retention_ms(ttl_ms));
    let lost = |cause| LockError::Lost {
        key: hold.name().to_owned(),
        cause,
    };
    match hold
        .core
        .backend()
        .pass(&hold.keys, &hold.token, next, ttl_ms, retention_ms)
        .await?
    {
        Pass::Passed { fence, queued } => Ok((fence, queued)),
        Pass::Refused(Found::Other) => Err(lost(LostCause::TakenOver)),
        Pass::Refused(_) => Err(lost(LostCause::Expired)),
    }
}
