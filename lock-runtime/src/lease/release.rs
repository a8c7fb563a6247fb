//! Releasing a lock: the release script, with retries on a fresh
//! connection, and background releases that go on while the lock could be
//! held.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Found;
use crate::error::LockError;
use crate::lease::hold::{drift_margin, Hold};
use crate::lease::loss;

/// Compare-and-delete (or, with `hold_at_least`, compare-and-keep), and wake
/// the waiter the lock's mark names: one backend round trip, retried on a
/// fresh connection within the call's deadline.
///
/// `may_have_run`: an earlier release of this hold failed without an answer
/// and may have run in Redis. Then, as for a retry within this call, finding
/// the key gone or another holder's token in it while the lock was still
/// valid means that earlier release did its work: not a loss.
pub(crate) async fn release(hold: &Hold, may_have_run: bool) -> Result<(), LockError> {
    hold.settled().await;
    let keep_ms = hold.keep_for().as_millis() as u64;
    let backend = hold.core.backend();
    let (kind, keys, token) = (hold.kind, &hold.keys, hold.token.as_str());
    // Where it goes: a switch of primary learned of later may concern it.
    let mut tag = hold.core.replays().map(|replays| replays.tag());
    let send = || async {
        match backend.as_redis() {
            Some(redis) => {
                redis
                    .release_hinted(kind, keys, token, keep_ms, hold.plain)
                    .await
            }
            None => backend.release(kind, keys, token, keep_ms).await,
        }
    };
    let mut reply = send().await?;
    if reply.found == Found::Other {
        // Passed the lock in the process, after a switch: the new primary
        // may hold the passer's token (`replay.rs`).
        if let Some(replays) = hold.core.replays() {
            if replays.adopt(hold).await {
                tag = Some(replays.tag());
                reply = send().await?;
            }
        }
    }
    let answered = Instant::now();
    // An earlier attempt (of this call, or an earlier release) may have
    // done the work: finding the key gone or another's while the lock was
    // still valid is then a success.
    let earlier_may_have_run = may_have_run || reply.retried;
    let found =
        if reply.found != Found::Mine && earlier_may_have_run && reply.sent_at < hold.valid_until()
        {
            Found::Mine
        } else {
            reply.found
        };
    let lost = |cause| LockError::Lost {
        name: hold.name().to_owned(),
        cause,
    };
    match found {
        Found::Mine => {
            tracing::debug!(lock = %hold.name(), "released");
            if let (Some(replays), Some(tag)) = (hold.core.replays(), tag) {
                replays.released(hold, tag, reply.sent_at, reply.found != Found::Mine);
            }
            if reply.woke {
                hold.core.handed_over(&hold.keys.lock);
            }
            Ok(())
        }
        // Deleted or replaced while the validity had time, else expired
        // or taken over (`loss.rs`).
        found => Err(lost(loss::shown(hold, found, answered))),
    }
}

/// After a release that kept the key (`hold_at_least`): keeps `hold`, and
/// so its entry in its client's holder record, for as long as the key is
/// kept, so that `lockctl show` names the process that ran the job while
/// the key lives (a hold released before it was recorded, under a second,
/// gets recorded meanwhile). Nothing when nothing is kept.
pub(crate) fn keep_recorded(hold: Arc<Hold>) {
    let keep = hold.keep_for();
    if keep.is_zero() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::time::sleep(keep).await;
        drop(hold);
    });
}

/// The first pause between background release attempts, doubled up to
/// [`MAX_RELEASE_PAUSE`].
pub(crate) const FIRST_RELEASE_PAUSE: Duration = Duration::from_millis(20);
pub(crate) const MAX_RELEASE_PAUSE: Duration = Duration::from_secs(1);

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
        let until = hold.valid_until() + drift_margin(hold.ttl) + hold.core.call_deadline();
        let mut may_have_run = may_have_run;
        let mut pause = FIRST_RELEASE_PAUSE;
        let mut failures = 0u32;
        loop {
            match release(&hold, may_have_run).await {
                result @ (Ok(()) | Err(LockError::Lost { .. })) => {
                    if failures > 0 && hold.was_handed_out() {
                        tracing::info!(lock = %hold.name(), failures, "released after failed attempts");
                    } else if failures > 0 {
                        // An acquisition whose caller was told it failed:
                        // nobody held this lock, so no line says it was released.
                        tracing::debug!(
                            lock = %hold.name(), failures,
                            "a failed acquisition's possible lock cleared after failed attempts"
                        );
                    }
                    if hold.linger() {
                        linger(&hold, until).await;
                    }
                    if result.is_ok() {
                        keep_recorded(hold);
                    }
                    return;
                }
                Err(error) => {
                    failures += 1;
                    may_have_run = true;
                    if Instant::now() + pause >= until {
                        if hold.was_handed_out() {
                            tracing::warn!(
                                lock = %hold.name(), %error, failures,
                                "release failed and is given up: the lock frees itself when its ttl passes"
                            );
                        } else {
                            tracing::warn!(
                                lock = %hold.name(), %error, failures,
                                "an acquisition that failed may have taken the lock for nobody; \
                                 clearing it failed and is given up: it frees itself when its ttl passes"
                            );
                        }
                        return;
                    }
                    tracing::debug!(
                        lock = %hold.name(), %error, failures,
                        "background release failed; tried again"
                    );
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
