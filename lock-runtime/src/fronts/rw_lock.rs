//! The read/write lock builder: many readers or one writer.

use std::time::Duration;

use crate::backend::Kind;
use crate::fronts::lock::Lock;

/// A distributed read/write lock, described: many readers at once, or one
/// writer. Build it like a [`Lock`], then take a side with
/// [`read`](RwLock::read) or [`write`](RwLock::write), each a [`Lock`] with
/// `acquire`, `try_acquire` and `run`.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::RwLock;
///
/// let prices = RwLock::new("prices").ttl(Duration::from_secs(5)).wait(Duration::from_secs(2));
/// let guard = prices.read().acquire().await?; // alongside other readers
/// // ... read ...
/// guard.release().await?;
/// let total = prices.write().run(async { /* alone */ 42 }).await?;
/// # let _ = total; Ok(()) }
/// ```
///
/// With the attribute, `read` or `write` picks the side:
///
/// ```no_run
/// use lock_runtime::{distributed_lock, LockError};
///
/// #[distributed_lock(key = "prices:<shop>", ttl = "5s", wait = "2s", read)]
/// async fn quote(shop: u64) -> Result<u64, LockError> {
///     Ok(100) // many quotes at once
/// }
///
/// #[distributed_lock(key = "prices:<shop>", ttl = "5s", wait = "10s", write)]
/// async fn reprice(shop: u64) -> Result<(), LockError> {
///     Ok(()) // alone: no quote sees half the new prices
/// }
/// ```
///
/// Every reader holds its own share (its own token and its own expiry on
/// the Redis server's clock): a reader that dies frees its share within its
/// ttl without shortening anyone else's, and a renewal extends only the
/// renewing reader's share. A writer waiting for the readers to leave stops
/// new readers from entering, so a stream of readers cannot starve it. All
/// of a lock's state lives in one hash slot (`lock:{name}:rw...`), apart
/// from the exclusive [`Lock`] of the same name: use one kind per name.
///
/// Reentrant by task: inside a body holding the lock, a read (of a read or
/// a write hold) or a write (of a write hold) enters at once and shares the
/// outer hold; a write inside a read fails at once with
/// [`LockError::Config`](crate::LockError::Config), since it would wait for
/// its own read share forever.
#[derive(Clone, Debug)]
pub struct RwLock {
    lock: Lock,
}

impl RwLock {
    super::lock_options!();

    /// A read/write lock called `name`, with the default ttl, no waiting and
    /// the process-wide client.
    pub fn new(name: impl Into<String>) -> Self {
        RwLock {
            lock: Lock::new(name).with_kind(Kind::Write),
        }
    }

    /// The read side: a share held alongside other readers, while no
    /// writer holds or waits.
    pub fn read(&self) -> Lock {
        self.lock.clone().with_kind(Kind::Read)
    }

    /// The write side: held alone, with no reader.
    pub fn write(&self) -> Lock {
        self.lock.clone().with_kind(Kind::Write)
    }

    /// The lock's name, as given.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Writers take a free lock only in their order of arrival (a newcomer
    /// does not overtake a queued writer). Readers always queue behind a
    /// waiting writer, fair or not.
    pub fn fair(self) -> Self {
        self.map(Lock::fair)
    }

    /// See [`Lock::fencing`]: every acquisition, a reader's or a writer's,
    /// gets a token larger than every one handed out before for this lock.
    pub fn fencing(self) -> Self {
        self.map(Lock::fencing)
    }

    /// See [`Lock::hold_at_least`]; for the write side only (a read side
    /// taken with it fails with a configuration error).
    pub fn hold_at_least(self, hold_at_least: Duration) -> Self {
        self.map(|lock| lock.hold_at_least(hold_at_least))
    }

    fn map(self, set: impl FnOnce(Lock) -> Lock) -> Self {
        RwLock {
            lock: set(self.lock),
        }
    }
}
