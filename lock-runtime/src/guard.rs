//! A held lock and its release.

use std::fmt;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::error::{LockError, LostCause};
use crate::scripts::RELEASE;

/// What the holder knows about its lock.
pub(crate) struct Held {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    /// When the acquiring command was sent: the key's expiry is at most
    /// `ttl` after this instant (a monotonic clock, not the wall clock).
    pub(crate) acquired_at: Instant,
}

impl Held {
    /// Compare-and-delete: one EVALSHA round trip.
    async fn release(&self) -> Result<(), LockError> {
        let mut connection = self.client.connection();
        let outcome: i64 = self
            .client
            .call(&self.name, "release", async {
                RELEASE
                    .key(&self.key)
                    .arg(&self.token)
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        match outcome {
            1 => {
                tracing::debug!(lock = %self.name, "released");
                Ok(())
            }
            0 => Err(LockError::Lost {
                key: self.name.clone(),
                cause: LostCause::Expired,
            }),
            _ => Err(LockError::Lost {
                key: self.name.clone(),
                cause: LostCause::TakenOver,
            }),
        }
    }

    /// Releases in a background task; used when a guard is dropped without
    /// `release()`, and after an acquire whose outcome is unknown.
    pub(crate) fn spawn_cleanup(client: Client, key: String, token: String) {
        let held = Held {
            name: key.clone(),
            client,
            key,
            token,
            ttl: Duration::ZERO,
            acquired_at: Instant::now(),
        };
        held.spawn_release();
    }

    fn spawn_release(self) {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match self.release().await {
                        Ok(()) | Err(LockError::Lost { .. }) => {}
                        Err(error) => tracing::warn!(
                            lock = %self.name, %error,
                            "background release failed; the lock frees itself when its ttl passes"
                        ),
                    }
                });
            }
            Err(_) => tracing::warn!(
                lock = %self.name,
                "lock guard dropped outside a Tokio runtime; the lock frees itself when its ttl passes"
            ),
        }
    }
}

/// A held lock. Release it with [`release`](LockGuard::release); a guard that
/// is dropped without it (early return, `?`, panic, cancelled future)
/// releases in a background task on the current Tokio runtime.
#[must_use = "a lock guard is released as soon as it is dropped"]
pub struct LockGuard {
    held: Option<Held>,
}

impl LockGuard {
    pub(crate) fn new(held: Held) -> Self {
        LockGuard { held: Some(held) }
    }

    fn held(&self) -> &Held {
        self.held
            .as_ref()
            .expect("a LockGuard holds its lock until release or drop")
    }

    /// The lock's name, as given to [`Lock::new`](crate::Lock::new).
    pub fn name(&self) -> &str {
        &self.held().name
    }

    /// The Redis key holding the lock, e.g. `lock:{order:42}`.
    pub fn redis_key(&self) -> &str {
        &self.held().key
    }

    /// This acquisition's random token (the value stored in the key).
    pub fn token(&self) -> &str {
        &self.held().token
    }

    /// The ttl the lock was taken with.
    pub fn ttl(&self) -> Duration {
        self.held().ttl
    }

    /// A lower bound on how long the lock stays valid, from the holder's
    /// monotonic clock: `ttl` after the acquiring command was sent, minus the
    /// time since. Zero means the lock may already have expired.
    pub fn remaining(&self) -> Duration {
        let held = self.held();
        held.ttl.saturating_sub(held.acquired_at.elapsed())
    }

    /// Releases the lock in one round trip.
    ///
    /// Returns [`LockError::Lost`] if the key had expired or another holder
    /// had taken it; the other holder's lock is left untouched. If this
    /// future is dropped before it completes, the guard is dropped with it
    /// and the release goes on in the background: a cancelled release never
    /// leaves the lock held until its ttl.
    pub async fn release(mut self) -> Result<(), LockError> {
        let result = self.held().release().await;
        // Only now is the guard disarmed: a cancelled release above drops
        // `self` with the lock still recorded, and Drop releases it.
        self.held = None;
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.spawn_release();
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            Some(held) => f
                .debug_struct("LockGuard")
                .field("name", &held.name)
                .field("token", &held.token)
                .field("remaining", &self.remaining())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}
