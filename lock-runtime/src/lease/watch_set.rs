//! Running a body under a set of locks held at once (`Lock::all`): one
//! scope per lock in the task's chain (so that each is reentrant inside the
//! body, and `current()` returns the last of the set), and the body stopped
//! as soon as any lock of the set is lost (or, for a lock the set shares
//! with an outer holder, that holder's hold ends).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::futures::OwnedNotified;
use tokio::task::futures::TaskLocalFuture;

use crate::error::LostCause;
use crate::lease::hold::Hold;
use crate::lease::watch::{current_scope, in_scope, stop_cause, this_task, Scope};

/// One lock of the set, as the body's watch sees it.
struct Member {
    hold: Arc<Hold>,
    stop_on_loss: bool,
    reentrant: bool,
    /// Woken when the hold is lost or released; `None` when neither stops
    /// the body.
    signal: Option<Pin<Box<OwnedNotified>>>,
}

pin_project! {
    /// A body under a set of locks; its output, or the index of the first
    /// lock found lost and why.
    pub(crate) struct WatchedSet<F: Future> {
        #[pin]
        body: TaskLocalFuture<Arc<Scope>, F>,
        scopes: Vec<Arc<Scope>>,
        members: Vec<Member>,
        #[pin]
        deadline: tokio::time::Sleep,
    }
}

/// Runs `body` under every hold of `holds` (with whether it is shared with
/// an outer holder: a reentrant entry), as a chain of scopes in their order.
pub(crate) fn watch_set<F: Future>(holds: Vec<(Arc<Hold>, bool)>, body: F) -> WatchedSet<F> {
    let mut scopes: Vec<Arc<Scope>> = Vec::with_capacity(holds.len());
    let mut members = Vec::with_capacity(holds.len());
    let mut outer = current_scope();
    for (hold, reentrant) in holds {
        let scope = Scope::nested(Arc::clone(&hold), outer.take(), false);
        outer = Some(Arc::clone(&scope));
        scopes.push(scope);
        let stop_on_loss = hold.stop_on_loss;
        members.push(Member {
            signal: (stop_on_loss || reentrant).then(|| hold.loss_signal()),
            hold,
            stop_on_loss,
            reentrant,
        });
    }
    let innermost = outer.expect("a set has at least one lock");
    let until = earliest(&members);
    WatchedSet {
        body: in_scope(innermost, body),
        scopes,
        members,
        deadline: tokio::time::sleep_until(until),
    }
}

/// When the first renewed lock of the set that stops the body runs out of
/// validity (far away when none does).
fn earliest(members: &[Member]) -> tokio::time::Instant {
    members
        .iter()
        .filter(|member| member.stop_on_loss)
        .map(|member| member.hold.valid_until())
        .min()
        .unwrap_or_else(|| tokio::time::Instant::now() + std::time::Duration::from_secs(86_400))
}

impl<F: Future> Future for WatchedSet<F> {
    type Output = Result<F::Output, (usize, LostCause)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let task = this_task();
        for scope in this.scopes.iter() {
            scope.polled_by(task);
        }
        for (index, member) in this.members.iter_mut().enumerate() {
            if let Some(signal) = member.signal.as_mut() {
                // Registered before the check below, so that a loss recorded
                // between the two still wakes this task.
                if signal.as_mut().poll(cx).is_ready() {
                    *signal = member.hold.loss_signal();
                    let _ = signal.as_mut().poll(cx);
                }
            }
            if let Some(cause) = stop_cause(&member.hold, member.stop_on_loss, member.reentrant) {
                return Poll::Ready(Err((index, cause)));
            }
        }
        if let Poll::Ready(output) = this.body.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if this.members.iter().any(|member| member.stop_on_loss) {
            let until = earliest(this.members);
            if this.deadline.deadline() != until {
                this.deadline.as_mut().reset(until);
            }
            if this.deadline.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}
