//! Extending a held lock by hand ([`LockGuard::extend`]): one renewal of
//! this lock alone, with the ttl the caller gives.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Found, RenewItem};
use crate::error::{ConfigError, LockError};
use crate::lease::guard::LockGuard;
use crate::lease::loss;
use crate::lease::MAX_DURATION_MS;

impl LockGuard {
    /// Makes the lock expire `ttl` from now, if it is still this holder's:
    /// one round trip, the renewal's compare-and-`PEXPIRE` (a key that
    /// expired, or that another holder took, is never created or touched
    /// again). The guard's validity ([`remaining`](crate::HeldLock::remaining))
    /// then counts from when the call was sent. Shorter than what is left
    /// shortens it: this sets the expiry, it does not add to it.
    ///
    /// For a lock taken without [`renew`](crate::Lock::renew): rslock's
    /// `extend`, redsync's `Extend`, Redisson's lease time set again. A
    /// renewed lock is kept by its renewals (which would set the expiry
    /// back to its ttl), so `extend` on it is a [`LockError::Config`]. On a
    /// reentrant guard it extends the hold it shares.
    ///
    /// ```no_run
    /// # async fn next_batch() -> bool { false }
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::Lock;
    ///
    /// let guard = Lock::new("import").ttl(Duration::from_secs(30)).acquire().await?;
    /// while next_batch().await {
    ///     guard.extend(Duration::from_secs(30)).await?; // 30 s from now, or Lost
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`LockError::Lost`]: the key had expired or was another holder's
    ///   (the guard's lock is lost for good: its release reports it too).
    /// - [`LockError::Config`]: `ttl` is not from 1 ms to a year, or the
    ///   lock is renewed.
    /// - [`LockError::Redis`]: Redis did not answer (over a quorum: a
    ///   majority did not confirm); the expiry may or may not have moved,
    ///   and the guard's validity is unchanged.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        let hold = Arc::clone(self.hold());
        let name = hold.name().to_owned();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 || ttl_ms > MAX_DURATION_MS {
            return Err(ConfigError::InvalidTtl {
                name,
                ttl,
                reason: "extend needs a ttl from 1 ms to a year (8760 h)",
            }
            .into());
        }
        if hold.renewed {
            return Err(ConfigError::Unsupported {
                name,
                reason: "extend is for a lock taken without `renew`: a renewed lock is kept by \
                         its renewals, every ttl/3, for as long as it is held",
            }
            .into());
        }
        // A lock passed in the process: its hand-off's outcome first.
        hold.settled().await;
        if let Some(cause) = hold.reported_loss() {
            return Err(LockError::Lost { name, cause });
        }
        let items = [RenewItem {
            kind: hold.kind,
            keys: &hold.keys,
            token: &hold.token,
            ttl_ms,
        }];
        let round_trips = AtomicU64::new(0);
        let sent_at = Instant::now();
        let found = hold
            .core
            .backend()
            .renew(&items, &round_trips)
            .await
            .map_err(|source| LockError::redis(&name, "extend", source))?;
        match found.first().copied().flatten() {
            Some(Found::Mine) => {
                hold.extend_for(sent_at, Duration::from_millis(ttl_ms));
                Ok(())
            }
            Some(found) => {
                let cause = loss::shown(&hold, found, Instant::now());
                hold.mark_lost(cause);
                Err(LockError::Lost { name, cause })
            }
            None => Err(LockError::redis(
                &name,
                "extend",
                redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "not confirmed by a majority of the nodes; the lock's validity is unchanged",
                )),
            )),
        }
    }
}
