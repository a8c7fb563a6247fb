//! The lock builder and acquisition: try once, or wait with jittered backoff.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{global_client, Client};
use crate::error::LockError;
use crate::guard::{spawn_release, LockGuard, OnLost};
use crate::hold::Hold;
use crate::keys::lock_key;
use crate::token::new_token;

/// A distributed lock, described: its name, ttl, how long to wait, and which
/// client to use. Building one costs nothing and touches no network; it is
/// taken with [`acquire`](Lock::acquire), [`try_acquire`](Lock::try_acquire)
/// or [`run`](Lock::run).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use std::time::Duration;
/// use lock_runtime::Lock;
///
/// let guard = Lock::new("order:42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2))
///     .acquire()
///     .await?;
/// // ... the critical section ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    name: String,
    ttl: Duration,
    wait: Option<Duration>,
    renew: bool,
    max_hold: Option<Duration>,
    /// `None` until set, so that setting it without `renew` is an error.
    on_lost: Option<OnLost>,
    client: Option<Client>,
}

/// The longest ttl accepted: a year, far inside what Redis accepts for PX.
const MAX_TTL_MS: u64 = 365 * 24 * 3600 * 1000;

/// Outcome of one acquisition attempt.
enum Attempt {
    Acquired,
    /// Held by another holder, whose key expires after the given time when
    /// Redis told it.
    Busy(Option<Duration>),
}

impl Lock {
    /// The ttl used when none is given: 30 seconds.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// A lock called `name` (e.g. `"lottery:2026-11-22"`), with the default
    /// ttl, no waiting and the process-wide client.
    pub fn new(name: impl Into<String>) -> Self {
        Lock {
            name: name.into(),
            ttl: Self::DEFAULT_TTL,
            wait: None,
            renew: false,
            max_hold: None,
            on_lost: None,
            client: None,
        }
    }

    /// How long the lock stays held if its holder never releases it (crash,
    /// hang): Redis deletes the key after this long. Whole milliseconds; at
    /// least 1 ms.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](Lock::acquire) waits for a busy lock before
    /// failing with [`LockError::WaitTimeout`]. Without it, a busy lock fails
    /// at once with [`LockError::Busy`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Keeps the lock for as long as it is held, however long that is: the
    /// client's renewal driver extends its expiry every `ttl / 3` with a
    /// script that touches only this acquisition's token. The holder keeps a
    /// local validity deadline; with [`OnLost::Stop`] (the default), a body
    /// run under the lock is dropped as soon as the lock is lost.
    pub fn renew(mut self) -> Self {
        self.renew = true;
        self
    }

    /// With [`renew`](Lock::renew): stop renewing this long after the lock
    /// was acquired. The lock then expires within one ttl and the holder is
    /// told ([`LostCause::MaxHold`](crate::LostCause::MaxHold)).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// With [`renew`](Lock::renew): what happens to a body running under the
    /// lock when the lock is lost (default [`OnLost::Stop`]).
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = Some(on_lost);
        self
    }

    /// Use this client instead of the process-wide one.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The lock's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the lock: once when no `wait` was set, else retrying until the
    /// wait runs out.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        match self.wait {
            None => self.try_acquire().await,
            Some(wait) => self.acquire_waiting(wait).await,
        }
    }

    /// Takes the lock if it is free, in one round trip; never waits.
    pub async fn try_acquire(&self) -> Result<LockGuard, LockError> {
        let (client, key, ttl_ms) = self.prepare()?;
        let token = new_token()?;
        let sent_at = Instant::now();
        match self.attempt(&client, &key, &token, ttl_ms, false).await? {
            Attempt::Acquired => Ok(self.guard(client, key, token, sent_at)),
            Attempt::Busy(_) => Err(LockError::Busy {
                key: self.name.clone(),
            }),
        }
    }

    /// Runs `body` while holding the lock, then releases it: what
    /// `#[distributed_lock]` does.
    ///
    /// Fails without running `body` when the lock cannot be taken. Inside
    /// `body`, [`current()`](crate::current) returns the lock. A renewed lock
    /// that is lost stops `body` (see [`LockGuard::run`]) and this returns
    /// [`LockError::Lost`]. If `body` panics or the returned future is
    /// dropped, the lock is released in the background. If the release after
    /// a finished body finds the lock already lost (a body that outlived an
    /// unrenewed ttl), the body's output is still returned, since its work is
    /// done, and the loss is logged at error level.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let guard = self.acquire().await?;
        let output = guard.run(body).await?;
        if let Err(error) = guard.release().await {
            tracing::error!(lock = %self.name, %error, "critical section finished, but its release failed");
        }
        Ok(output)
    }

    fn prepare(&self) -> Result<(Client, String, u64), LockError> {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(LockError::config(format!(
                "lock `{}` has a ttl of {:?}; it must be from 1 ms to {MAX_TTL_MS} ms (a year)",
                self.name, self.ttl
            )));
        }
        if !self.renew && (self.max_hold.is_some() || self.on_lost.is_some()) {
            return Err(LockError::config(format!(
                "lock `{}` sets max_hold or on_lost without renew; they only apply to renewed \
                 locks: add `.renew()`",
                self.name
            )));
        }
        let client = match &self.client {
            Some(client) => client.clone(),
            None => global_client()?,
        };
        let key = lock_key(client.key_prefix(), &self.name)?;
        Ok((client, key, ttl_ms))
    }

    fn guard(&self, client: Client, key: String, token: String, sent_at: Instant) -> LockGuard {
        tracing::debug!(lock = %self.name, "acquired");
        let renewer = client.renewer();
        let hold = Hold::new(
            client,
            self.name.clone(),
            key,
            token,
            self.ttl,
            self.renew,
            sent_at,
        );
        let renewal = self.renew.then(|| {
            let renew_until = self.max_hold.map(|max_hold| sent_at + max_hold);
            renewer.register(Arc::clone(&hold), renew_until)
        });
        LockGuard::new(hold, renewal, self.on_lost.unwrap_or_default())
    }

    async fn acquire_waiting(&self, wait: Duration) -> Result<LockGuard, LockError> {
        let (client, key, ttl_ms) = self.prepare()?;
        let token = new_token()?;
        let started = Instant::now();
        // `Duration::MAX` and other huge waits mean "wait as long as it takes".
        let deadline = started.checked_add(wait);
        let mut backoff = Backoff::new();
        loop {
            let sent_at = Instant::now();
            match self.attempt(&client, &key, &token, ttl_ms, true).await? {
                Attempt::Acquired => return Ok(self.guard(client, key, token, sent_at)),
                Attempt::Busy(expires_in) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|deadline| now >= deadline) {
                        return Err(LockError::WaitTimeout {
                            key: self.name.clone(),
                            waited: now - started,
                        });
                    }
                    let mut pause = backoff.next();
                    if let Some(expires_in) = expires_in {
                        // Never sleep past the holder's expiry: a holder that
                        // died is taken over as soon as its key is gone.
                        pause = pause.min(expires_in + Duration::from_millis(1));
                    }
                    if let Some(deadline) = deadline {
                        pause = pause.min(deadline - now);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One attempt: `SET key token NX PX ttl`, with a `PTTL` pipelined behind
    /// it (same round trip) when the caller will wait.
    async fn attempt(
        &self,
        client: &Client,
        key: &str,
        token: &str,
        ttl_ms: u64,
        with_pttl: bool,
    ) -> Result<Attempt, LockError> {
        // Until an answer comes, the SET may have taken the lock: if this
        // attempt fails or is cancelled, remove a lock we might hold without
        // knowing it.
        let mut uncertain = Uncertain {
            client,
            name: &self.name,
            key,
            token,
            resolved: false,
        };
        let mut connection = client.connection();
        let mut set = redis::cmd("SET");
        set.arg(key).arg(token).arg("NX").arg("PX").arg(ttl_ms);
        let result = if with_pttl {
            let mut pipe = redis::pipe();
            pipe.add_command(set).cmd("PTTL").arg(key);
            client
                .call(&self.name, "acquire", async {
                    let (set, pttl): (Option<String>, i64) =
                        pipe.query_async(&mut connection).await?;
                    Ok(match set {
                        Some(_) => Attempt::Acquired,
                        None => Attempt::Busy(u64::try_from(pttl).ok().map(Duration::from_millis)),
                    })
                })
                .await
        } else {
            client
                .call(&self.name, "acquire", async {
                    let set: Option<String> = set.query_async(&mut connection).await?;
                    Ok(match set {
                        Some(_) => Attempt::Acquired,
                        None => Attempt::Busy(None),
                    })
                })
                .await
        };
        if result.is_ok() {
            uncertain.resolved = true;
        }
        result
    }
}

/// Cleans up after an acquire attempt whose outcome is unknown.
struct Uncertain<'a> {
    client: &'a Client,
    name: &'a str,
    key: &'a str,
    token: &'a str,
    resolved: bool,
}

impl Drop for Uncertain<'_> {
    fn drop(&mut self) {
        if !self.resolved {
            let (client, key, token) = (
                self.client.clone(),
                self.key.to_owned(),
                self.token.to_owned(),
            );
            let name = self.name.to_owned();
            spawn_release(Hold::new(
                client,
                name,
                key,
                token,
                Duration::ZERO,
                false,
                Instant::now(),
            ));
        }
    }
}

/// Exponential backoff with jitter: 2 ms doubling to 64 ms, each pause drawn
/// from [d/2, d] so that waiters spread out.
struct Backoff {
    ceiling: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(2);
    const MAX: Duration = Duration::from_millis(64);

    fn new() -> Self {
        Backoff {
            ceiling: Self::FIRST,
        }
    }

    fn next(&mut self) -> Duration {
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(Self::MAX);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}
