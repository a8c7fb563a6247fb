//! A value tasks wait on until it satisfies them: the part of
//! `tokio::sync::watch` this crate needs, with its waiters woken in a fixed
//! order. `watch` files each waiter under one of eight lists picked by
//! tokio's own random generator, which nothing seeds; woken list by list,
//! several waiters then ran in a different order from one run to the next,
//! and lock-sim's replays of one seed differed (cluster seeds 22, 29, 31).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

pub(crate) struct Signal<T> {
    value: Mutex<T>,
    changed: Notify,
    /// Nothing will change any more (its owner is gone).
    closed: AtomicBool,
}

impl<T> Signal<T> {
    pub(crate) fn new(value: T) -> Self {
        Signal {
            value: Mutex::new(value),
            changed: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Nothing will change any more: every waiter is let go.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// The value now (do not hold it across an await).
    pub(crate) fn borrow(&self) -> MutexGuard<'_, T> {
        self.value
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the value with `modify`, which says whether it changed;
    /// if it did, every waiter looks again. Returns what `modify` said.
    pub(crate) fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        let modified = modify(&mut self.borrow());
        if modified {
            self.changed.notify_waiters();
        }
        modified
    }

    /// Waits until the value satisfies `wanted` (`true`), or the signal is
    /// closed (`false`).
    pub(crate) async fn wait_for(&self, mut wanted: impl FnMut(&T) -> bool) -> bool {
        loop {
            // Registered before the look: a change made after it wakes
            // this waiter.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if wanted(&self.borrow()) {
                return true;
            }
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            changed.await;
        }
    }
}

/// A listener to a number that only grows (a count of events): each
/// [`changed`](Changes::changed) returns once it grew past what this
/// listener saw last, as `watch::Receiver::changed`. Public for lock-sim's
/// learners only (`Client::switches_learned`, feature `simulation`).
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub))]
pub struct Changes {
    signal: Arc<Signal<u64>>,
    seen: u64,
}

/// The signal was closed: nothing will change any more.
#[derive(Debug)]
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub))]
pub struct Closed;

#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub, dead_code))]
impl Changes {
    /// A listener that has seen the number as it is now.
    pub(crate) fn new(signal: &Arc<Signal<u64>>) -> Changes {
        let seen = *signal.borrow();
        Changes {
            signal: Arc::clone(signal),
            seen,
        }
    }

    /// Waits until the number grew past the last one seen; then it is seen.
    pub async fn changed(&mut self) -> Result<u64, Closed> {
        let seen = self.seen;
        if !self.signal.wait_for(|number| *number > seen).await {
            return Err(Closed);
        }
        self.seen = *self.signal.borrow();
        Ok(self.seen)
    }

    /// The last number seen.
    pub fn seen(&self) -> u64 {
        self.seen
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Signal;

    #[tokio::test]
    async fn a_waiter_sees_a_change_made_after_it_looked() {
        let signal = Arc::new(Signal::new(0));
        let waiter = tokio::spawn({
            let signal = Arc::clone(&signal);
            async move { signal.wait_for(|value| *value == 2).await }
        });
        tokio::task::yield_now().await;
        assert!(signal.send_if_modified(|value| {
            *value = 1;
            true
        }));
        assert!(!signal.send_if_modified(|_| false));
        signal.send_if_modified(|value| {
            *value = 2;
            true
        });
        waiter.await.unwrap();
        assert_eq!(*signal.borrow(), 2);
    }
}
