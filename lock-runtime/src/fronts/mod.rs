//! The public fronts: thin typed builders and guards over the lease
//! machinery (`lease`).

/// The builder options the read/write lock and the semaphore pass on, as
/// they are, to the `Lock` each wraps (`self.map(..)` sets one on it).
macro_rules! lock_options {
    () => {
        /// See [`Lock::ttl`](crate::Lock::ttl): each holder's share (or
        /// permit) expires after this long unless released or renewed.
        pub fn ttl(self, ttl: std::time::Duration) -> Self {
            self.map(|lock| lock.ttl(ttl))
        }

        /// See [`Lock::wait`](crate::Lock::wait).
        pub fn wait(self, wait: std::time::Duration) -> Self {
            self.map(|lock| lock.wait(wait))
        }

        /// See [`Lock::renew`](crate::Lock::renew): each share (or permit)
        /// is renewed on its own.
        pub fn renew(self) -> Self {
            self.map(crate::Lock::renew)
        }

        /// See [`Lock::max_hold`](crate::Lock::max_hold).
        pub fn max_hold(self, max_hold: std::time::Duration) -> Self {
            self.map(|lock| lock.max_hold(max_hold))
        }

        /// See [`Lock::on_lost`](crate::Lock::on_lost).
        pub fn on_lost(self, on_lost: crate::OnLost) -> Self {
            self.map(|lock| lock.on_lost(on_lost))
        }

        /// Use this client instead of the process-wide one.
        pub fn client(self, client: crate::Client) -> Self {
            self.map(|lock| lock.client(client))
        }

        /// See [`Lock::metric_label`](crate::Lock::metric_label): the `lock`
        /// label of its metrics, a template such as `"prices:<shop>"`
        /// (default [`Lock::DEFAULT_METRIC_LABEL`](crate::Lock::DEFAULT_METRIC_LABEL)).
        pub fn metric_label(self, label: impl Into<std::borrow::Cow<'static, str>>) -> Self {
            self.map(|lock| lock.metric_label(label))
        }

        /// See [`Lock::caller`](crate::Lock::caller): what takes it, for the
        /// holder record lockctl shows.
        pub fn caller(self, caller: impl Into<std::borrow::Cow<'static, str>>) -> Self {
            self.map(|lock| lock.caller(caller))
        }
    };
}
pub(crate) use lock_options;

pub(crate) mod holder;
pub(crate) mod lock;
pub(crate) mod multi_lock;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;
