//! Taking a lock: reentry, one attempt, and waiting woken by releases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::error::LockError;
use crate::guard::{spawn_release, LockGuard, OnLost};
use crate::hold::{Acquired, Hold};
use crate::keys::LockKeys;
use crate::lock::Lock;
use crate::notify::wait_for;
use crate::scripts::{evalsha, run, ACQUIRE, LEAVE};
use crate::token::new_token;

/// A waiter that has not refreshed its place in the queue for this long
/// loses it (it crashed, or stopped waiting without saying so).
pub(crate) const WAITER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a waiter refreshes its place when nothing wakes it.
const QUEUE_REFRESH: Duration = Duration::from_millis(500);
/// The longest a waiter sleeps without news when Redis gave no expiry.
const FALLBACK_PAUSE: Duration = Duration::from_millis(100);
/// Fencing counters live at least this long after their last acquisition.
const FENCE_RETENTION: Duration = Duration::from_secs(60);

/// One call of `acquire` / `try_acquire`, with everything resolved.
pub(crate) struct Acquisition<'a> {
    pub(crate) lock: &'a Lock,
    pub(crate) client: Client,
    pub(crate) keys: LockKeys,
    pub(crate) ttl_ms: u64,
    /// The same lock, already held by a caller up this task's call chain.
    pub(crate) held: Option<Arc<Hold>>,
}

/// Outcome of one attempt.
enum Attempt {
    /// Acquired, with its fencing token when one was asked for.
    Acquired(Option<u64>),
    /// Held by another holder, whose key expires after the given time when
    /// Redis told it (none when free but another waiter is first in line).
    Busy(Option<Duration>),
}

impl Acquisition<'_> {
    /// Reentry: the lock is already held up this task's call chain.
    pub(crate) fn reentered(&self) -> Result<Option<LockGuard>, LockError> {
        let Some(hold) = &self.held else {
            return Ok(None);
        };
        if let Some(cause) = hold.lost_cause(Instant::now()) {
            return Err(LockError::Lost {
                key: hold.name().to_owned(),
                cause,
            });
        }
        if self.lock.settings().fencing && hold.fencing_token.is_none() {
            return Err(LockError::config(format!(
                "lock `{}` asks for a fencing token, but its outer holder in this task took it \
                 without one: add `fencing` to the outer lock too",
                hold.name()
            )));
        }
        Ok(Some(LockGuard::reentrant(Arc::clone(hold))))
    }

    pub(crate) async fn once(&self) -> Result<LockGuard, LockError> {
        let token = new_token()?;
        let sent_at = Instant::now();
        let respect = self.lock.settings().fair;
        match self.attempt(&token, "", false, respect).await? {
            Attempt::Acquired(fence) => Ok(self.guard(token, sent_at, fence)),
            Attempt::Busy(_) => Err(LockError::Busy {
                key: self.lock.name_str().to_owned(),
            }),
        }
    }

    /// Whether this attempt must let queued waiters go first: always in fair
    /// mode, and right after this client handed the lock to a waiter (so a
    /// holder that releases and asks again at once does not snatch the lock
    /// back from the waiter it just woke).
    fn respects_queue(&self) -> bool {
        self.lock.settings().fair || self.client.just_handed_over(&self.keys.lock)
    }

    pub(crate) async fn waiting(&self, wait: Duration) -> Result<LockGuard, LockError> {
        let token = new_token()?;
        let fair = self.lock.settings().fair;
        let started = Instant::now();
        // `Duration::MAX` and other huge waits mean "wait as long as it takes".
        let deadline = started.checked_add(wait);
        // The place in the queue is given up if the waiter stops waiting.
        let notifier = self.client.notifier();
        let member = format!("{}|{token}", notifier.channel());
        let mut place = QueuePlace {
            client: &self.client,
            keys: &self.keys,
            member: member.clone(),
            left: false,
        };
        let mut subscription = notifier.join_ready(&token);
        let mut respect = self.respects_queue();
        loop {
            let notified = subscription
                .as_ref()
                .map(crate::notify::Subscription::notified);
            let sent_at = Instant::now();
            let expires_in = match self.attempt(&token, &member, true, respect).await? {
                Attempt::Acquired(fence) => {
                    place.left = true; // the acquire script took it out of the queue
                    return Ok(self.guard(token, sent_at, fence));
                }
                Attempt::Busy(expires_in) => expires_in,
            };
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(LockError::WaitTimeout {
                    key: self.lock.name_str().to_owned(),
                    waited: now - started,
                });
            }
            if subscription.is_none() {
                // Listen for releases, then try again at once: a release
                // between the attempt above and the subscription is not lost.
                // Not longer than a refresh interval, so the place just
                // taken in the queue cannot expire meanwhile.
                let left = deadline.map_or(Duration::MAX, |deadline| deadline - now);
                subscription = Some(notifier.subscribe(&token, left.min(QUEUE_REFRESH)).await);
                continue;
            }
            // A holder that just handed over lets its waiter go first only
            // until its own first wait.
            respect = fair;
            // Woken by the release that makes this waiter first in line;
            // never asleep past the holder's expiry (a holder that died is
            // taken over as soon as its key is gone), past the refresh of
            // its place in the queue, or past the wait.
            let mut pause = match expires_in {
                Some(expires_in) => expires_in + Duration::from_millis(1),
                None => FALLBACK_PAUSE,
            };
            pause = pause.min(QUEUE_REFRESH);
            if let Some(deadline) = deadline {
                pause = pause.min(deadline - now);
            }
            wait_for(notified, pause).await;
        }
    }

    fn guard(&self, token: String, sent_at: Instant, fencing_token: Option<u64>) -> LockGuard {
        let settings = self.lock.settings();
        tracing::debug!(lock = %self.lock.name_str(), ?fencing_token, "acquired");
        let hold = Hold::new(Acquired {
            client: self.client.clone(),
            keys: self.keys.clone(),
            token,
            ttl: settings.ttl,
            renewed: settings.renew,
            sent_at,
            confirmed_at: Instant::now(),
            fencing_token,
            hold_at_least: settings.hold_at_least,
            stop_on_loss: settings.on_lost == OnLost::Stop,
        });
        let renewal = settings.renew.then(|| {
            let renew_until = settings.max_hold.map(|max_hold| sent_at + max_hold);
            self.client
                .renewer()
                .register(Arc::clone(&hold), renew_until)
        });
        LockGuard::new(hold, renewal)
    }

    /// One attempt, one round trip: a plain `SET NX PX` when the attempt
    /// neither joins nor respects the waiters' queue and needs no fencing
    /// token, else the acquire script.
    async fn attempt(
        &self,
        token: &str,
        member: &str,
        join_queue: bool,
        respect_queue: bool,
    ) -> Result<Attempt, LockError> {
        // Until an answer comes, the script may have taken the lock: if this
        // attempt fails or is cancelled, remove a lock we might hold without
        // knowing it.
        let mut uncertain = Uncertain {
            client: &self.client,
            keys: &self.keys,
            token,
            resolved: false,
        };
        let fencing = self.lock.settings().fencing;
        let result = if join_queue || respect_queue || fencing {
            Box::pin(self.script_attempt(token, member, join_queue, respect_queue, fencing)).await
        } else {
            self.set_if_free(token).await
        };
        if result.is_ok() {
            uncertain.resolved = true;
        }
        result
    }

    /// `SET key token NX PX ttl`: what an uncontended lock costs.
    async fn set_if_free(&self, token: &str) -> Result<Attempt, LockError> {
        let mut connection = self.client.connection();
        self.client
            .call(self.lock.name_str(), "acquire", async {
                let bytes = self.keys.lock.len() + token.len() + 32;
                let set: redis::Value = redis::Cmd::with_capacity(6, bytes)
                    .arg("SET")
                    .arg(&self.keys.lock)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(self.ttl_ms)
                    .query_async(&mut connection)
                    .await?;
                match set {
                    redis::Value::Okay => Ok(Attempt::Acquired(None)),
                    redis::Value::SimpleString(ok) if ok == "OK" => Ok(Attempt::Acquired(None)),
                    redis::Value::Nil => Ok(Attempt::Busy(None)),
                    // Not what Redis answers SET NX; an unknown outcome (the
                    // caller cleans up a lock it may hold).
                    other => Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "unexpected reply to SET NX PX",
                        format!("{other:?}"),
                    ))),
                }
            })
            .await
    }

    /// The acquire script: the queue, and the fencing token.
    async fn script_attempt(
        &self,
        token: &str,
        member: &str,
        join_queue: bool,
        respect_queue: bool,
        fencing: bool,
    ) -> Result<Attempt, LockError> {
        let waiter_timeout_ms = WAITER_TIMEOUT.as_millis() as u64;
        // 0: no fencing token.
        let retention_ms = if fencing {
            (FENCE_RETENTION.as_millis() as u64).max(self.ttl_ms)
        } else {
            0
        };
        let mut connection = self.client.connection();
        let lock_key = self.keys.lock.len();
        let bytes = 4 * lock_key + 24 + token.len() + 60 + member.len();
        let mut cmd = evalsha(&ACQUIRE, 4, 11, bytes);
        cmd.arg(&self.keys.lock)
            .arg(self.keys.fence())
            .arg(self.keys.queue())
            .arg(self.keys.waiters())
            .arg(token)
            .arg(self.ttl_ms)
            .arg(retention_ms)
            .arg(waiter_timeout_ms)
            .arg(u8::from(join_queue))
            .arg(u8::from(respect_queue))
            .arg(member);
        self.client
            .call(self.lock.name_str(), "acquire", async {
                let (acquired, value): (i64, i64) = run(&ACQUIRE, &cmd, &mut connection).await?;
                Ok(if acquired == 1 {
                    Attempt::Acquired(fencing.then_some(value as u64))
                } else {
                    Attempt::Busy(u64::try_from(value).ok().map(Duration::from_millis))
                })
            })
            .await
    }
}

/// Cleans up after an acquire attempt whose outcome is unknown.
struct Uncertain<'a> {
    client: &'a Client,
    keys: &'a LockKeys,
    token: &'a str,
    resolved: bool,
}

impl Drop for Uncertain<'_> {
    fn drop(&mut self) {
        if !self.resolved {
            let now = Instant::now();
            spawn_release(Hold::new(Acquired {
                client: self.client.clone(),
                keys: self.keys.clone(),
                token: self.token.to_owned(),
                ttl: Duration::ZERO,
                renewed: false,
                sent_at: now,
                confirmed_at: now,
                fencing_token: None,
                hold_at_least: None,
                stop_on_loss: false,
            }));
        }
    }
}

/// A waiter's place in the queue, given up when it stops waiting without
/// the lock (timed out, failed or cancelled).
struct QueuePlace<'a> {
    client: &'a Client,
    keys: &'a LockKeys,
    member: String,
    left: bool,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the place expires after WAITER_TIMEOUT
        };
        let (client, keys, member) = (self.client.clone(), self.keys.clone(), self.member.clone());
        runtime.spawn(async move {
            let mut connection = client.connection();
            let mut cmd = evalsha(&LEAVE, 3, 4, 3 * keys.lock.len() + 16 + member.len());
            cmd.arg(&keys.lock)
                .arg(keys.queue())
                .arg(keys.waiters())
                .arg(&member);
            let _ = client
                .call(
                    &keys.lock,
                    "leave the queue",
                    run::<i64>(&LEAVE, &cmd, &mut connection),
                )
                .await;
        });
    }
}
