//! The release of a holder in its client's cohort (`cohort.rs`): the lock
//! passed to the next waiting task of the client with one `HANDOFF`, or
//! released through Redis.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{Found, Pass};
use crate::error::{LockError, LostCause};
use crate::lease::cohort::{Next, Passed, Waiter, Wants};
use crate::lease::hold::{drift_margin, fence_retention_ms, late_reply, Acquired, Hold};
use crate::lease::release::{release, spawn_release, FIRST_RELEASE_PAUSE, MAX_RELEASE_PAUSE};

/// The release of a holder in its client's cohort (`cohort.rs`) of this
/// generation: passes the lock to the next task of its client waiting for
/// it, with one `HANDOFF` (the next holder's own token and ttl); or, when
/// others wait in Redis and had their share, releases it and then ends the
/// cohort; or, with nobody waiting here, releases it.
/// Leaves nothing to its caller: a release that fails goes on in the
/// background, one after a timed-out attempt lingers (see [`pass_to`] for
/// a pass).
fn pass_or_release(hold: Arc<Hold>, generation: u64) -> BoxFuture<'static, Result<(), LockError>> {
    Box::pin(async move {
        // A hold passed early: its own pass's outcome first (the starvation
        // count and a refusal are known before the next decision).
        hold.settled().await;
        let result = match next_step(&hold, generation) {
            Next::Pass(waiter) => return pass_to(hold, generation, waiter).await,
            Next::Release => release_then_dissolve(&hold, generation).await,
            Next::Alone => release(&hold, false).await,
        };
        match &result {
            Err(LockError::Redis { .. }) => spawn_release(hold, true),
            _ if hold.linger() => spawn_release(hold, true),
            _ => {}
        }
        result
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
        // Its failures are taken care of (and reported by the background
        // release when it gives up): nobody is left to tell.
        let _ = pass_or_release(hold, generation).await;
        dissolve.disarm();
    });
}

/// Passes `hold`'s lock to `waiter` (see [`pass_or_release`]): early (the
/// waiter starts at once, see `cohort.rs`) when it wants no fencing token
/// and `hold` is valid for at least half the waiter's ttl; else after the
/// `HANDOFF` reply. Leaves nothing to its caller: whatever `hold`'s token
/// still needs (a background release after an unanswered `HANDOFF`, a
/// lingering one) is started here, and never while the next holder may run
/// under that token.
pub(crate) fn pass_to(
    hold: Arc<Hold>,
    generation: u64,
    waiter: Waiter,
) -> BoxFuture<'static, Result<(), LockError>> {
    Box::pin(async move {
        // A hold passed early itself: its token must be in the key first.
        hold.settled().await;
        let cohorts = hold.core.cohorts();
        let key = &hold.keys.lock;
        let token = match hold.core.new_token() {
            Ok(token) => token,
            Err(error) => {
                let _ = waiter.send(Passed::Redis);
                cohorts.dissolve(key, generation);
                if let Err(LockError::Redis { .. }) = release(&hold, false).await {
                    spawn_release(hold, true);
                }
                return Err(error);
            }
        };
        let wants = waiter.wants;
        let sent_at = Instant::now();
        // `hold` is marked released by now: any other loss it knows of, or
        // too little validity left, and the waiter waits for the reply.
        let valid_for = hold.valid_until().saturating_duration_since(sent_at);
        let early = !wants.fencing
            && !hold.pass_refused()
            && matches!(hold.reported_loss(), None | Some(LostCause::Released))
            && valid_for >= wants.ttl / 2;
        if early {
            pass_early(hold, generation, waiter, token, sent_at).await
        } else {
            pass_confirmed(hold, generation, waiter, token, sent_at).await
        }
    })
}

/// The hold `hold` passes to a waiter that wants `wants`, with `token`,
/// its `HANDOFF` sent at `sent_at`.
fn next_hold(
    hold: &Hold,
    wants: Wants,
    token: String,
    sent_at: Instant,
    fence: Option<u64>,
    early: Option<watch::Receiver<bool>>,
) -> Arc<Hold> {
    Hold::new(Acquired {
        core: Arc::clone(&hold.core),
        kind: hold.kind,
        keys: hold.keys.clone(),
        token,
        ttl: wants.ttl,
        renewed: wants.renewed,
        sent_at,
        confirmed_at: Instant::now(),
        fencing_token: fence,
        hold_at_least: wants.hold_at_least,
        stop_on_loss: wants.stop_on_loss,
        linger: false,
        // Until its `HANDOFF` is confirmed, the key holds `hold`'s token:
        // it lives as long as `hold` is valid.
        expires_by: early
            .is_some()
            .then(|| hold.valid_until() + drift_margin(wants.ttl)),
        settled: early,
        // Passed in the process: its value is what the hand-off wrote.
        plain: false,
    })
}

/// After a pass Redis answered, `hold`'s token is not in the key: if an
/// attempt of its acquisition timed out (a copy may still land), keep
/// checking for it.
fn linger_after_pass(hold: Arc<Hold>) {
    if hold.linger() {
        spawn_release(hold, true);
    }
}

/// After a pass refused: on one server the `HANDOFF` wrote nothing, but
/// over a quorum it is refused when a majority no longer held the passer's
/// value, and the nodes that still held it swapped it for the next token
/// (found by a review: that token stayed there for the next holder's whole
/// ttl, a node less for every majority). The caller gives the next token
/// back; the passer's value, wherever the pass did not land, is given back
/// here. On one server both are compare-and-deletes that find nothing: a
/// round trip each, on a path that only a lost key takes.
fn give_back_refused(hold: Arc<Hold>) {
    spawn_release(hold, true);
}

/// What a hold nobody runs under is made with: not renewed, kept no longer
/// than its release.
fn orphaned(wants: Wants) -> Wants {
    Wants {
        renewed: false,
        stop_on_loss: false,
        hold_at_least: None,
        ..wants
    }
}

/// The waiter starts now; the `HANDOFF` follows, and its outcome is applied
/// to the waiter's hold before anything else is sent with its token.
async fn pass_early(
    hold: Arc<Hold>,
    generation: u64,
    waiter: Waiter,
    token: String,
    sent_at: Instant,
) -> Result<(), LockError> {
    let cohorts = hold.core.cohorts();
    let key = &hold.keys.lock;
    let wants = waiter.wants;
    let (settle, settled) = watch::channel(false);
    let next = next_hold(&hold, wants, token, sent_at, None, Some(settled));
    if waiter.send(Passed::Lock(Arc::clone(&next))).is_err() {
        // Gone before anything was sent: the next one, or a release.
        return pass_or_release(hold, generation).await;
    }
    crate::observe::handed_off(hold.label());
    let outcome = handoff_until_answered(&hold, &next).await;
    let result = match outcome {
        Ok((_, queued)) => {
            next.extend(sent_at);
            cohorts.passed(key, generation, queued);
            linger_after_pass(hold);
            Ok(())
        }
        Err(LockError::Lost { name, cause }) => {
            next.mark_pass_refused();
            next.mark_lost(cause);
            // The next holder's release sends nothing (its lock is lost),
            // but its token may be on some nodes: given back here.
            spawn_release(
                next_hold(
                    &hold,
                    orphaned(wants),
                    next.token.clone(),
                    sent_at,
                    None,
                    None,
                ),
                false,
            );
            give_back_refused(hold);
            Err(LockError::Lost { name, cause })
        }
        Err(error) => {
            // No answer while `hold` was valid: by now its key has expired
            // (or holds the next token, if a copy landed: the next holder's
            // release lingers for it), and the next holder's validity, which
            // was `hold`'s, is over. `hold`'s token is never released here:
            // the next holder may have run under it.
            next.set_linger();
            next.mark_pass_refused();
            next.mark_lost(LostCause::Expired);
            Err(error)
        }
    };
    let _ = settle.send(true);
    result
}

/// The early pass's `HANDOFF`, sent again (it is idempotent: a copy that
/// already landed is answered "passed") until Redis answers or `hold`'s
/// validity, under which the next holder runs, is over. An answer is
/// needed before the next holder's token is used: without one, the key
/// may hold `hold`'s token, and the next holder's release or renewal would
/// take it for another client's while a late copy could still land.
async fn handoff_until_answered(
    hold: &Hold,
    next: &Hold,
) -> Result<(Option<u64>, bool), LockError> {
    let ttl_ms = next.ttl.as_millis() as u64;
    // Paced as a background release is.
    let mut pause = FIRST_RELEASE_PAUSE;
    loop {
        match handoff(hold, &next.token, ttl_ms, false).await {
            Err(LockError::Redis { .. }) if Instant::now() + pause < hold.valid_until() => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RELEASE_PAUSE);
            }
            answered => return answered,
        }
    }
}

/// The `HANDOFF` first, then the waiter is told (with its fencing token).
async fn pass_confirmed(
    hold: Arc<Hold>,
    generation: u64,
    waiter: Waiter,
    token: String,
    sent_at: Instant,
) -> Result<(), LockError> {
    let cohorts = hold.core.cohorts();
    let key = &hold.keys.lock;
    let wants = waiter.wants;
    let ttl_ms = wants.ttl.as_millis() as u64;
    match handoff(&hold, &token, ttl_ms, wants.fencing).await {
        // Valid no longer when Redis answered (a `HANDOFF` held up past the
        // waiter's ttl): no lock for the waiter, which goes through Redis
        // as after a failed pass; the token it was to have is released.
        // As `hold::late_reply` for a lock taken from Redis (found by
        // lock-sim node seed 2243).
        Ok(_) if late_reply(sent_at, None, wants.ttl).is_some() => {
            let _ = waiter.send(Passed::Redis);
            cohorts.dissolve(key, generation);
            linger_after_pass(Arc::clone(&hold));
            spawn_release(
                next_hold(&hold, orphaned(wants), token, sent_at, None, None),
                false,
            );
            Ok(())
        }
        Ok((fence, queued)) => {
            cohorts.passed(key, generation, queued);
            linger_after_pass(Arc::clone(&hold));
            let next = next_hold(&hold, wants, token.clone(), sent_at, fence, None);
            crate::observe::handed_off(hold.label());
            if waiter.send(Passed::Lock(next)).is_err() {
                // The waiter gave up meanwhile: the lock holds a token
                // nobody has; pass it on, or release it.
                let orphan = next_hold(&hold, orphaned(wants), token, sent_at, None, None);
                cohorts.holds(key, generation, &orphan);
                pass_on(orphan, generation);
            }
            Ok(())
        }
        Err(error) => {
            let _ = waiter.send(Passed::Redis);
            cohorts.dissolve(key, generation);
            let orphan = next_hold(&hold, orphaned(wants), token, sent_at, None, None);
            match &error {
                LockError::Redis { .. } => {
                    // Unknown outcome: the key may hold either token.
                    orphan.set_linger();
                    spawn_release(orphan, true);
                    spawn_release(hold, true);
                }
                _ => {
                    // Refused; the next token may still be on some nodes.
                    spawn_release(orphan, false);
                    give_back_refused(hold);
                }
            }
            Err(error)
        }
    }
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
    // Passed on, `hold`'s token is ended: the pass is made good on a new
    // primary after a switch, as a release is (`replay.rs`).
    let mut tag = hold.core.replays().map(|replays| replays.tag());
    let mut sent_at = Instant::now();
    let lost = |cause| LockError::Lost {
        name: hold.name().to_owned(),
        cause,
    };
    let send = || {
        hold.core
            .backend()
            .pass(&hold.keys, &hold.token, next, ttl_ms, retention_ms)
    };
    let mut outcome = send().await?;
    if let Pass::Refused(Found::Other) = outcome {
        // Itself passed the lock in the process, after a switch: the new
        // primary may hold its passer's token (`replay.rs`).
        if let Some(replays) = hold.core.replays() {
            if replays.adopt(hold).await {
                tag = Some(replays.tag());
                sent_at = Instant::now();
                outcome = send().await?;
            }
        }
    }
    match outcome {
        Pass::Passed { fence, queued } => {
            if let (Some(replays), Some(tag)) = (hold.core.replays(), tag) {
                replays.passed(hold, next, ttl_ms, tag, sent_at);
            }
            Ok((fence, queued))
        }
        // Deleted or replaced while the passer's validity had time, else
        // expired or taken over (`loss.rs`).
        Pass::Refused(found) => Err(lost(crate::lease::loss::shown(hold, found, Instant::now()))),
    }
}
