//! Connections for acknowledged calls (`Config::acknowledged`).
//!
//! `WAIT` blocks the connection it is sent on until the replicas confirm or
//! its timeout passes: on the client's one multiplexed connection, the
//! `WAIT`s of concurrent calls would run one after the other (the n-th
//! waiting n timeouts, then failing at the call deadline with an unknown
//! outcome) and every other call of the client (releases, renewals) would
//! queue behind them. So each acknowledged call borrows a connection of its
//! own from this pool: an idle one, or a new one while fewer than
//! [`MAX_OPEN`] are open (beyond, it shares the client's connection). A
//! connection whose call did not finish (timed out, cancelled) is dropped,
//! not reused: it may be stalled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connection::{Ack, Link, Target};

/// The most connections the pool opens.
const MAX_OPEN: usize = 32;

pub(crate) struct AckPool {
    target: Target,
    idle: Mutex<Vec<Link>>,
    open: AtomicUsize,
}

/// A connection borrowed from the pool; back to it when the call finished
/// ([`Borrowed::finished`]), dropped otherwise.
pub(crate) struct Borrowed {
    pool: Arc<AckPool>,
    link: Option<Link>,
    finished: bool,
    /// Opened for this call: it connects first (see [`nudged`]).
    fresh: bool,
}

impl AckPool {
    pub(crate) fn new(target: Target) -> Arc<AckPool> {
        Arc::new(AckPool {
            target,
            idle: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
        })
    }

    /// A connection of its own for one call, if the pool has or may open
    /// one.
    pub(crate) fn borrow(self: &Arc<Self>) -> Option<Borrowed> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        let fresh = idle.is_none();
        let link = match idle {
            Some(link) => link,
            None => {
                let opened = self
                    .open
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                        (open < MAX_OPEN).then_some(open + 1)
                    });
                if opened.is_err() {
                    return None;
                }
                self.target.open()
            }
        };
        Some(Borrowed {
            pool: Arc::clone(self),
            link: Some(link),
            finished: false,
            fresh,
        })
    }
}

impl Borrowed {
    pub(crate) fn link(&self) -> Link {
        self.link
            .clone()
            .expect("a borrowed connection until dropped")
    }

    /// Whether the connection was opened for this call: it connects (and
    /// says hello) before the call is sent, so the call's send time, from
    /// which its `WAIT`'s timeout runs, is not known.
    pub(crate) fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// The call finished (with an answer or an error): the connection can
    /// serve another.
    pub(crate) fn finished(&mut self) {
        self.finished = true;
    }
}

/// Runs `call` on the connection `borrowed` lent (if any), which goes back
/// to the pool only if `call` finished (not if it was dropped unfinished).
pub(crate) async fn on_borrowed<T>(
    borrowed: Option<Borrowed>,
    call: impl std::future::Future<Output = T>,
) -> T {
    let mut borrowed = borrowed;
    let result = call.await;
    if let Some(borrowed) = &mut borrowed {
        borrowed.finished();
    }
    result
}

/// How long after an acknowledged call was sent its server is nudged (see
/// [`nudged`]): just past the `WAIT`'s timeout, which runs from a moment
/// later (the call's way there), and once more in case the first nudge
/// arrived a hair before it.
const NUDGES: [Duration; 2] = [Duration::from_millis(2), Duration::from_millis(15)];

/// Runs the acknowledged `call` (a write and its `WAIT`, `ack`), sending a
/// `PING` on `other` (a connection that is not the call's) once the
/// `WAIT`'s timeout has passed.
///
/// Redis answers a `WAIT` whose timeout passed when its event loop next
/// wakes: on an idle server, at its next tick (every 100 ms at the default
/// `hz`), so a refusal with 200 ms asked came after 200 to 300 ms. Any
/// command wakes the loop, and the `WAIT` is answered at once, with its
/// true count: the refusal comes within the timeout plus about one round
/// trip. Nothing is sent when the call is answered before its timeout. Only
/// for a call on a connection of the pool that is already open: the first
/// call of a new one connects first, so its `WAIT` starts at a time the
/// client cannot tell, and it is left to Redis's tick.
pub(crate) async fn nudged<T>(
    ack: Ack,
    other: Link,
    call: impl std::future::Future<Output = T>,
) -> T {
    let nudge = async move {
        let mut other = other;
        let timeout = Duration::from_millis(ack.timeout_ms);
        let sent = tokio::time::Instant::now();
        for after in NUDGES {
            tokio::time::sleep_until(sent + timeout + after).await;
            let _ = redis::cmd("PING")
                .query_async::<redis::Value>(&mut other)
                .await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        biased;
        result = call => result,
        () = nudge => unreachable!("the nudge never ends"),
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let Some(link) = self.link.take() else {
            return;
        };
        if self.finished {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(link);
        } else {
            self.pool.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
