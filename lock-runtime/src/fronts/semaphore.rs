//! The semaphore builder: at most N permits held at once.

use std::future::Future;

use crate::backend::Kind;
use crate::error::LockError;
use crate::fronts::lock::Lock;
use crate::lease::guard::LockGuard;

/// A distributed semaphore, described: at most `permits` held at once,
/// across every process. Each acquisition takes one permit
/// ([`acquire`](Semaphore::acquire), [`run`](Semaphore::run)) or several at
/// once ([`acquire_many`](Semaphore::acquire_many)), as one atomic step.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::Semaphore;
///
/// let exports = Semaphore::new("exports", 4).ttl(Duration::from_secs(30)).renew();
/// let permit = exports.acquire().await?; // one of 4
/// // ... at most 4 of these run at once, in all processes ...
/// permit.release().await?;
///
/// // A heavy export takes 2 of the 4 permits, all or none:
/// let permits = exports.acquire_many(2).await?;
/// permits.release().await?;
///
/// // Or run a body under one permit, as `#[distributed_lock(permits = 4)]` does:
/// let rows = exports.run(async { /* export */ 120 }).await?;
/// # let _ = rows; Ok(()) }
/// ```
///
/// Every permit is its holder's own token with its own expiry on the Redis
/// server's clock: a holder that dies gives its permit back within its ttl,
/// with no cleanup job, and a release of a permit that expired (or was
/// never held) creates nothing and is reported as
/// [`LockError::Lost`](crate::LockError::Lost). The capacity is stored with
/// the semaphore while anybody holds it: opening it with another number of
/// permits then fails with [`LockError::Config`](crate::LockError::Config).
/// Waiters are woken by releases; with [`fair`](Semaphore::fair) they are
/// served in order of arrival.
///
/// Not reentrant: taken again inside a body holding it, a semaphore takes
/// more permits (as a `tokio::sync::Semaphore` does).
#[derive(Clone, Debug)]
pub struct Semaphore {
    lock: Lock,
    capacity: u32,
}

impl Semaphore {
    super::lock_options!();

    /// A semaphore called `name` with `permits` permits (at least 1), with
    /// the default ttl, no waiting and the process-wide client.
    pub fn new(name: impl Into<String>, permits: u32) -> Self {
        Semaphore {
            lock: Lock::new(name).with_kind(Kind::Semaphore {
                capacity: permits,
                permits: 1,
                fair: false,
            }),
            capacity: permits,
        }
    }

    /// `permits` of this semaphore, taken together: a [`Lock`] with
    /// `acquire`, `try_acquire` and `run`.
    pub fn take(&self, permits: u32) -> Lock {
        self.lock.clone().with_kind(Kind::Semaphore {
            capacity: self.capacity,
            permits,
            fair: false,
        })
    }

    /// Takes one permit: at once when no `wait` was set, else waiting
    /// until the wait runs out, woken by releases.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`]; [`ConfigError::PermitsMismatch`](crate::ConfigError::PermitsMismatch)
    /// when its holders opened the semaphore with another number of permits.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`]: a dropped attempt leaves no permit taken.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.lock.acquire().await
    }

    /// Takes `permits` permits in one atomic step (all or none).
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`]; [`ConfigError::PermitsMismatch`](crate::ConfigError::PermitsMismatch)
    /// when its holders opened the semaphore with another number of permits.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`]: a dropped attempt leaves no permit taken.
    pub async fn acquire_many(&self, permits: u32) -> Result<LockGuard, LockError> {
        self.take(permits).acquire().await
    }

    /// Takes one permit if one is free, in one round trip; never waits.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`]; [`ConfigError::PermitsMismatch`](crate::ConfigError::PermitsMismatch)
    /// when its holders opened the semaphore with another number of permits.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`]: a dropped attempt leaves no permit taken.
    pub async fn try_acquire(&self) -> Result<LockGuard, LockError> {
        self.lock.try_acquire().await
    }

    /// Takes `permits` permits if they are free, in one round trip.
    ///
    /// # Errors
    ///
    /// As [`Lock::acquire`]; [`ConfigError::PermitsMismatch`](crate::ConfigError::PermitsMismatch)
    /// when its holders opened the semaphore with another number of permits.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`]: a dropped attempt leaves no permit taken.
    pub async fn try_acquire_many(&self, permits: u32) -> Result<LockGuard, LockError> {
        self.take(permits).try_acquire().await
    }

    /// Runs `body` holding one permit, then gives it back: what
    /// `#[distributed_lock(permits = N)]` does. See [`Lock::run`].
    ///
    /// # Errors
    ///
    /// As [`Lock::run`].
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::run`]: the body is dropped and the permit given back.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        self.lock.run(body).await
    }

    /// The semaphore's name, as given.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.capacity
    }

    /// Waiters get permits strictly in their order of arrival: nobody takes
    /// a permit that a waiter ahead of it is waiting for.
    pub fn fair(self) -> Self {
        self.map(Lock::fair)
    }

    fn map(self, set: impl FnOnce(Lock) -> Lock) -> Self {
        Semaphore {
            lock: set(self.lock),
            capacity: self.capacity,
        }
    }
}
