//! Taking a lock: reentry, one attempt, and waiting woken by releases.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::wait_for;
use crate::backend::{retryable, Acquire, AcquireRequest, Kind, Respect, WaitPlace};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::lease::cohort::{wait_for_pass, Joined, Passed, Wants};
use crate::lease::guard::{LockGuard, OnLost};
use crate::lease::hold::{fence_retention_ms, late_reply, Acquired, Hold};
use crate::lease::local_handoff::pass_on;
use crate::lease::release::spawn_release;

use crate::lease::watch::{Entered, Entry, Scope};
use crate::lease::Core;

/// A waiter that has not refreshed its place in the queue for this long
/// loses it (it crashed, or stopped waiting without saying so).
pub(crate) const WAITER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a waiter refreshes its place when nothing wakes it.
pub(crate) const QUEUE_REFRESH: Duration = Duration::from_millis(500);
/// The longest a waiter sleeps without news when Redis gave no expiry.
pub(crate) const FALLBACK_PAUSE: Duration = Duration::from_millis(100);
/// A waiter whose attempt failed on the connection tries again after this
/// long (doubled up to the refresh interval), while its wait lasts.
pub(crate) const FIRST_ERROR_PAUSE: Duration = Duration::from_millis(20);

/// One call of `acquire` / `try_acquire`, with everything resolved.
pub(crate) struct Acquisition<'a> {
    /// The lock's name, as given.
    pub(crate) name: &'a str,
    /// Its `lock` label in the metrics, and the function taking it.
    pub(crate) label: Option<&'a Cow<'static, str>>,
    pub(crate) caller: Option<&'a Cow<'static, str>>,
    pub(crate) settings: Settings,
    pub(crate) core: Arc<Core>,
    pub(crate) keys: LockKeys,
    pub(crate) ttl_ms: u64,
    /// The innermost scope of the same lock up this task's call chain.
    pub(crate) held: Option<Arc<Scope>>,
    /// When the wait ends, counted from when the acquisition began (`None`
    /// without a wait, or for a wait too long to count).
    pub(crate) deadline: Option<Instant>,
}

/// A lock's settings, as an acquisition needs them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) kind: Kind,
    pub(crate) ttl: Duration,
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) on_lost: OnLost,
    pub(crate) fair: bool,
    pub(crate) fencing: bool,
    pub(crate) hold_at_least: Option<Duration>,
    /// How long to wait for a busy lock, if at all.
    pub(crate) wait: Option<Duration>,
}

/// Where a waiting acquire stands in its client's cohort.
pub(crate) enum Cohort<'a> {
    /// Another task of this client passed the lock to this one.
    Passed(LockGuard),
    /// This task goes to Redis for its client's cohort.
    Representative(Representative<'a>),
    /// Its wait ran out in the queue while no task of its client held the
    /// lock (the representative waiting in Redis, a holder that lost it, a
    /// pass still unanswered): one last attempt through Redis tells how the
    /// lock stands (busy, free, or Redis not answering), as the last
    /// attempt of a wait in Redis does.
    LastTry,
}

/// The task that goes to Redis for its client's cohort: if it does not get
/// the lock (an error, the wait over, cancelled), the cohort dissolves and
/// its waiters go to Redis themselves.
pub(crate) struct Representative<'a> {
    acquisition: &'a Acquisition<'a>,
    generation: u64,
    kept: bool,
    /// It waited in a cohort that ended: maybe after a release that woke a
    /// waiter of another client, which its first attempt must not race.
    pub(crate) after_dissolve: bool,
}

impl Representative<'_> {
    /// It holds the lock now: `guard` carries the cohort on.
    pub(crate) fn keep(mut self, guard: &mut LockGuard) {
        self.kept = true;
        let acquisition = self.acquisition;
        acquisition
            .core
            .cohorts()
            .holds(&acquisition.keys.lock, self.generation, guard.hold());
        guard.cohort = Some(self.generation);
    }

    /// A sign of life while it waits in Redis.
    pub(crate) fn heartbeat(&self) {
        let acquisition = self.acquisition;
        acquisition
            .core
            .cohorts()
            .heartbeat(&acquisition.keys.lock, self.generation);
    }
}

impl Drop for Representative<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let acquisition = self.acquisition;
            acquisition
                .core
                .cohorts()
                .dissolve(&acquisition.keys.lock, self.generation);
        }
    }
}

/// A task queued in its client's cohort. Dropped while queued (the wait
/// over, cancelled), it leaves the queue; a lock passed to it meanwhile is
/// passed on (or released).
struct Queued<'a> {
    acquisition: &'a Acquisition<'a>,
    /// `u64::MAX` once it left.
    id: u64,
    generation: u64,
    receiver: tokio::sync::oneshot::Receiver<Passed>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.id == u64::MAX {
            return;
        }
        let acquisition = self.acquisition;
        acquisition
            .core
            .cohorts()
            .leave(&acquisition.keys.lock, self.id);
        // Closed first: a pass sent from now on fails, and its sender
        // passes the lock on; one sent before is here.
        self.receiver.close();
        if let Ok(Passed::Lock(hold)) = self.receiver.try_recv() {
            acquisition
                .core
                .cohorts()
                .holds(&acquisition.keys.lock, self.generation, &hold);
            pass_on(hold, self.generation);
        }
    }
}

/// Outcome of one attempt.
enum Attempt {
    /// Acquired, with its fencing token when one was asked for, the key's
    /// remaining ttl when the lock was found already taken with this token
    /// (by an earlier attempt whose answer was lost), and the value the lock
    /// holds when it is not the token (over a quorum: the winning attempt's).
    Acquired(Option<u64>, Option<Duration>, Option<String>),
    /// Held by another holder, whose key expires after the given time when
    /// Redis told it (none when free but another waiter is first in line).
    Busy(Option<Duration>),
}

impl Acquisition<'_> {
    /// Reentry: the lock is already held up this task's call chain. The
    /// entry takes the scope's permit, so concurrent entries of one task
    /// exclude each other as entries from elsewhere do: at once without
    /// `wait` (`Busy`), else within the wait (`WaitTimeout`). A permit held
    /// by a manual guard is not waited for: the entry may be nested under
    /// that guard, waiting for itself.
    pub(crate) async fn reentered(
        &self,
        scope: &Arc<Scope>,
        entry: Entry,
    ) -> Result<LockGuard, LockError> {
        let hold = scope.hold();
        let settings = &self.settings;
        if settings.kind == Kind::Write && scope.reads() {
            // Waiting for the other readers to leave would wait for this
            // task's own share too: a deadlock (Redisson's upgrade). Under a
            // read entry of a write hold, it would run beside that entry's
            // sibling reads.
            return Err(ConfigError::Reentry {
                name: hold.name().to_owned(),
                reason: "it is held for reading, so it cannot be taken for writing here (the \
                         write would wait for this task's own read share forever): take the \
                         write lock before the read, or release the read first",
            }
            .into());
        }
        // A read entry (inside a read or a write hold) shares the scope with
        // other read entries; any other entry is alone in it.
        let entered = Entered::new(entry, settings.kind == Kind::Read);
        let missing = [
            (
                settings.fencing && hold.fencing_token.is_none(),
                "this entry asks for `fencing`, but the outer holder took the lock without it: \
                 a reentrant entry shares the outer hold, so add `fencing` to the outer lock too",
            ),
            (
                settings.renew && !hold.renewed,
                "this entry asks for `renew`, but the outer holder took the lock without it: \
                 a reentrant entry shares the outer hold, so add `renew` to the outer lock too",
            ),
            (
                settings.hold_at_least.is_some() && hold.hold_at_least.is_none(),
                "this entry asks for `hold_at_least`, but the outer holder took the lock \
                 without it: a reentrant entry shares the outer hold, so add `hold_at_least` to \
                 the outer lock too",
            ),
        ];
        if let Some((_, reason)) = missing.iter().find(|(missing, _)| *missing) {
            return Err(ConfigError::Reentry {
                name: hold.name().to_owned(),
                reason,
            }
            .into());
        }
        if !scope.try_enter(entered) {
            let name = self.name.to_owned();
            if scope.entered_by_guard() {
                return Err(ConfigError::Reentry {
                    name,
                    reason: "it is entered by a guard from `acquire()`, and this entry cannot \
                             tell whether it runs inside that guard (it would wait for itself) \
                             or beside it: run nested code with `guard.run(..)`, or release the \
                             guard first",
                }
                .into());
            }
            let Some(wait) = self.settings.wait else {
                return Err(LockError::Busy { name });
            };
            let started = Instant::now();
            if !scope.enter(entered, wait).await {
                return Err(LockError::WaitTimeout {
                    name,
                    waited: started.elapsed(),
                });
            }
        }
        let guard = LockGuard::reentrant(Arc::clone(scope), entered);
        if let Some(cause) = hold.lost_cause(Instant::now()) {
            return Err(LockError::Lost {
                name: hold.name().to_owned(),
                cause,
            }); // the guard gives the permit back
        }
        Ok(guard)
    }

    /// Joins this client's cohort for the key (`cohort.rs`): queues in the
    /// process while another task of this client holds the key or waits
    /// for it in Redis, until that task passes the lock on (the guard) or
    /// the cohort dissolves (then tries again, maybe as the representative),
    /// within the wait.
    pub(crate) async fn join_cohort(
        &self,
        started: Instant,
        wait: Duration,
    ) -> Result<Cohort<'_>, LockError> {
        let cohorts = self.core.cohorts();
        let key = &self.keys.lock;
        let mut dissolved = false;
        loop {
            let (receiver, id, generation) = match cohorts.join(key, self.wants()) {
                Joined::Representative(generation) => {
                    return Ok(Cohort::Representative(Representative {
                        acquisition: self,
                        generation,
                        kept: false,
                        after_dissolve: dissolved,
                    }))
                }
                Joined::Queued(receiver, id, generation) => (receiver, id, generation),
            };
            let mut queued = Queued {
                acquisition: self,
                id,
                generation,
                receiver,
            };
            let left = started.checked_add(wait).map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            match wait_for_pass(cohorts, key, generation, &mut queued.receiver, left).await {
                Some(Passed::Lock(hold)) => {
                    queued.id = u64::MAX; // nothing to leave
                    #[cfg(feature = "simulation")]
                    hold.mark_passed_in_process();
                    tracing::debug!(lock = %self.name, fencing_token = ?hold.fencing_token, "acquired (passed in the process)");
                    let mut guard = self.guard_for(hold);
                    cohorts.holds(key, generation, guard.hold());
                    guard.cohort = Some(generation);
                    return Ok(Cohort::Passed(guard));
                }
                Some(Passed::Redis) => {
                    queued.id = u64::MAX;
                    dissolved = true;
                }
                // Held by a task of this client through the end of the wait.
                None if cohorts.held(key, generation) => {
                    return Err(LockError::WaitTimeout {
                        name: self.name.to_owned(),
                        waited: started.elapsed(),
                    })
                }
                // Found by lock-sim (sentinel seeds 3101 and 9330, node
                // 10274): waiters queued behind a pass to a primary that
                // answered nothing ended `WaitTimeout`, not with Redis's error.
                None => return Ok(Cohort::LastTry),
            }
        }
    }

    /// One attempt, without waiting.
    pub(crate) async fn once(&self) -> Result<LockGuard, LockError> {
        self.once_until(None).await
    }

    /// [`once`](Self::once), its calls ending by `until` (a set's key
    /// tried after others: the set's try ends within one call deadline).
    pub(crate) async fn once_until(&self, until: Option<Instant>) -> Result<LockGuard, LockError> {
        let token = self.core.new_token()?;
        match self.first_attempt(&token, until).await? {
            Taken::Guard(guard) => Ok(guard),
            // The token moves into the hold (no copy of it is made).
            Taken::Plain(taken) => Ok(self.guard(token, taken)),
        }
    }

    /// [`once`](Self::once), as the acquisition's last step: the hold it
    /// takes gets the acquisition's keys, not a copy of them.
    pub(crate) async fn once_final(mut self) -> Result<LockGuard, LockError> {
        let token = self.core.new_token()?;
        match self.first_attempt(&token, None).await? {
            Taken::Guard(guard) => Ok(guard),
            Taken::Plain(taken) => {
                let keys = std::mem::take(&mut self.keys);
                Ok(self.guard_with(keys, token, taken))
            }
        }
    }

    /// The attempt of [`once`](Self::once) with `token`. A lock taken
    /// with the token as its value is left to the caller to make a guard
    /// of; one whose value is another (a shared kind's) comes as a guard.
    async fn first_attempt(&self, token: &str, until: Option<Instant>) -> Result<Taken, LockError> {
        let mut unknown = Unknown::new(self, token);
        match self
            .attempt(&mut unknown, "", false, self.fair(), None, until)
            .await?
        {
            Attempt::Acquired(fence, found, None) => {
                // The plain `SET NX PX` (`RedisBackend::acquire_once`): the
                // exclusive lock's try, unless fair or fenced.
                let settings = &self.settings;
                let plain = settings.kind == Kind::Exclusive
                    && !settings.fair
                    && !settings.fencing
                    && found.is_none();
                Ok(Taken::Plain(TakenAt {
                    plain,
                    ..unknown.settle(found, fence)
                }))
            }
            Attempt::Acquired(fence, found, holds) => {
                Ok(Taken::Guard(unknown.acquired(fence, found, holds)))
            }
            Attempt::Busy(_) => Err(LockError::Busy {
                name: self.name.to_owned(),
            }),
        }
    }

    /// Whom queued this attempt lets go first: every waiter, a set's too,
    /// right after this client handed the lock to a waiter (so a holder that
    /// releases and asks again at once does not snatch the lock back from
    /// the waiter it just woke, whatever its kind); else as
    /// [`fair`](Self::fair) says.
    pub(crate) fn respects_queue(&self) -> Respect {
        if self.core.just_handed_over(&self.keys.lock) {
            Respect::Everyone
        } else {
            self.fair()
        }
    }

    /// Whom queued every attempt lets go first: in fair mode, the first
    /// live waiter that is not a set's (a set's place keeps no key, §16).
    pub(crate) fn fair(&self) -> Respect {
        if self.settings.fair {
            Respect::Singles
        } else {
            Respect::No
        }
    }

    /// Waits for the lock (from `started`, for `wait`), in the queue of
    /// waiters that releases wake. `respect`: whom queued its first
    /// attempts let go first ([`respects_queue`](Self::respects_queue)).
    pub(crate) async fn waiting(
        &self,
        wait: Duration,
        started: Instant,
        respect: Respect,
    ) -> Result<LockGuard, LockError> {
        let token = self.core.new_token()?;
        let mut unknown = Unknown::new(self, &token);
        let fair = self.fair();
        // `Duration::MAX` and other huge waits mean "wait as long as it takes".
        let deadline = started.checked_add(wait);
        // The place in the queue is given up if the waiter stops waiting.
        let notifier = self.core.notifier();
        let kind = self.settings.kind;
        let (channel, slot) = notifier.channel_for(&self.keys.lock);
        let member = kind.queue_entry(&channel, &token);
        let mut place = QueuePlace {
            kind,
            core: &self.core,
            keys: &self.keys,
            member: member.clone(),
            left: false,
        };
        let mut subscription = notifier.join_ready(&token, slot);
        let mut respect = respect;
        let mut error_pause = FIRST_ERROR_PAUSE;
        // Over a quorum: this waiter's ticket and what its attempts showed.
        let line = WaitPlace::default();
        loop {
            let notified = subscription
                .as_ref()
                .map(crate::backend::Subscription::notified);
            let attempt = self.attempt(&mut unknown, &member, true, respect, Some(&line), None);
            let expires_in = match attempt.await {
                Ok(Attempt::Acquired(fence, found, holds)) => {
                    place.left = true; // the acquire script took it out of the queue
                    return Ok(unknown.acquired(fence, found, holds));
                }
                Ok(Attempt::Busy(expires_in)) => {
                    error_pause = FIRST_ERROR_PAUSE;
                    expires_in
                }
                // A connection that failed (and its retries within the call
                // deadline), or over a quorum too few nodes that answered:
                // not a reason to give up while the wait lasts. Tried again
                // until the wait ends (the last attempt at its end), then
                // the last error, at most one call deadline after the end.
                Err(LockError::Redis { source, .. })
                    if retryable(&source)
                        && deadline.is_none_or(|deadline| Instant::now() < deadline) =>
                {
                    let mut pause = error_pause;
                    if let Some(deadline) = deadline {
                        pause = pause.min(deadline.saturating_duration_since(Instant::now()));
                    }
                    tokio::time::sleep(pause).await;
                    error_pause = (error_pause * 2).min(QUEUE_REFRESH);
                    continue;
                }
                Err(error) => return Err(error),
            };
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(LockError::WaitTimeout {
                    name: self.name.to_owned(),
                    waited: now - started,
                });
            }
            if subscription.is_none() {
                // Listen for releases, then try again at once: a release
                // between the attempt above and the subscription is not lost.
                // Not longer than a refresh interval, so the place just
                // taken in the queue cannot expire meanwhile.
                let left = deadline.map_or(Duration::MAX, |deadline| deadline - now);
                subscription = Some(
                    notifier
                        .subscribe(&token, slot, left.min(QUEUE_REFRESH))
                        .await,
                );
                continue;
            }
            // Woken by the release that makes this waiter first in line;
            // never asleep past the holder's expiry (a holder that died is
            // taken over as soon as its key is gone), past the refresh of
            // its place in the queue, or past the wait. A holder that just
            // handed over and found the lock free with the woken waiter
            // first is told when that waiter releases (it stands next); if
            // the waiter is a set that cannot use the key yet, the key
            // stays free for it until the refresh (design §16).
            let mut pause = match expires_in {
                Some(expires_in) => expires_in.saturating_add(Duration::from_millis(1)),
                None if respect == Respect::Everyone => QUEUE_REFRESH,
                None => FALLBACK_PAUSE,
            };
            // A holder that just handed over lets its waiter go first only
            // until its own first wait.
            respect = fair;
            pause = pause.min(QUEUE_REFRESH);
            if let Some(deadline) = deadline {
                pause = pause.min(deadline - now);
            }
            wait_for(notified, pause).await;
        }
    }

    /// One attempt of a set's waiter taking its keys one by one while it
    /// stands in every key's line (`set_by_key.rs`): `member` is its place
    /// in this key's line (it ends in `*`), `token` this round's own. A key
    /// taken comes as a hold without a guard yet (the set may give it back).
    pub(crate) async fn attempt_in_line(
        &self,
        token: &str,
        member: &str,
        respect: Respect,
        place: &WaitPlace,
        until: Option<Instant>,
    ) -> Result<InLine, LockError> {
        let mut unknown = Unknown::new(self, token);
        match self
            .attempt(&mut unknown, member, true, respect, Some(place), until)
            .await?
        {
            Attempt::Acquired(fence, found, holds) => {
                let taken = unknown.settle(found, fence);
                let value = holds.unwrap_or_else(|| token.to_owned());
                Ok(InLine::Taken(Hold::new(Acquired {
                    linger: taken.stalled,
                    expires_by: taken.expires_by,
                    ..self.acquired(value, taken.sent_at, taken.fence)
                })))
            }
            Attempt::Busy(expires_in) => Ok(InLine::Busy(expires_in)),
        }
    }

    /// The guard of a hold [`attempt_in_line`](Self::attempt_in_line) took.
    pub(crate) fn guard_of(&self, hold: Arc<Hold>) -> LockGuard {
        tracing::debug!(lock = %self.name, fencing_token = ?hold.fencing_token, "acquired");
        self.guard_for(hold)
    }

    pub(crate) fn guard(&self, token: String, taken: TakenAt) -> LockGuard {
        self.guard_with(self.keys.clone(), token, taken)
    }

    /// [`guard`](Self::guard), the hold keeping `keys`.
    fn guard_with(&self, keys: LockKeys, token: String, taken: TakenAt) -> LockGuard {
        let fencing_token = taken.fence;
        tracing::debug!(lock = %self.name, ?fencing_token, "acquired");
        self.guard_for(Hold::new(Acquired {
            linger: taken.stalled,
            expires_by: taken.expires_by,
            plain: taken.plain,
            keys,
            ..self.acquired(token, taken.sent_at, fencing_token)
        }))
    }

    /// The guard of `hold`, made for this acquisition: renewed when asked.
    fn guard_for(&self, hold: Arc<Hold>) -> LockGuard {
        hold.taken_by(self.label, self.caller);
        let settings = &self.settings;
        let renewal = settings.renew.then(|| {
            let renew_until = settings
                .max_hold
                .map(|max_hold| hold.acquired_at + max_hold);
            self.core.renewer().register(Arc::clone(&hold), renew_until)
        });
        LockGuard::new(hold, renewal)
    }

    /// What a hold passed to this acquisition in the process is made with.
    fn wants(&self) -> Wants {
        let settings = &self.settings;
        Wants {
            ttl: settings.ttl,
            fencing: settings.fencing,
            renewed: settings.renew,
            stop_on_loss: settings.on_lost == OnLost::Stop,
            hold_at_least: settings.hold_at_least,
        }
    }

    pub(crate) fn acquired(
        &self,
        token: String,
        sent_at: Instant,
        fencing_token: Option<u64>,
    ) -> Acquired {
        let settings = &self.settings;
        Acquired {
            core: Arc::clone(&self.core),
            kind: settings.kind,
            keys: self.keys.clone(),
            token,
            ttl: settings.ttl,
            renewed: settings.renew,
            sent_at,
            confirmed_at: Instant::now(),
            fencing_token,
            hold_at_least: settings.hold_at_least,
            stop_on_loss: settings.on_lost == OnLost::Stop,
            linger: false,
            expires_by: None,
            settled: None,
            plain: false,
        }
    }

    /// One attempt, one round trip (see [`Backend::acquire`]: a plain `SET
    /// NX PX` when the attempt neither joins nor respects the waiters'
    /// queue, needs no fencing token and follows no attempt of unknown
    /// outcome; else the acquire script).
    ///
    /// [`Backend::acquire`]: crate::backend::Backend::acquire
    async fn attempt(
        &self,
        unknown: &mut Unknown<'_>,
        member: &str,
        join_queue: bool,
        respect_queue: Respect,
        place: Option<&WaitPlace>,
        until: Option<Instant>,
    ) -> Result<Attempt, LockError> {
        // Until an answer comes, this attempt may have taken the lock.
        let earlier_unknown = unknown.sent();
        let fencing = self.settings.fencing;
        let request = AcquireRequest {
            kind: self.settings.kind,
            keys: &self.keys,
            token: unknown.token,
            ttl_ms: self.ttl_ms,
            fence_retention_ms: fencing.then(|| fence_retention_ms(self.ttl_ms)),
            member,
            join: join_queue,
            respect: respect_queue,
            fair: self.settings.fair,
            deadline: self.deadline,
            mine: earlier_unknown,
            waiter_timeout_ms: WAITER_TIMEOUT.as_millis() as u64,
            place,
            until,
        };
        let backend = self.core.backend();
        let reply = match backend.as_redis() {
            Some(redis) => redis.acquire(request).await,
            None => backend.acquire(request).await,
        };
        let result = match reply {
            Ok(Acquire::Acquired {
                fence,
                found,
                holds,
            }) => Ok(Attempt::Acquired(fence, found, holds)),
            Ok(Acquire::Busy { expires_in }) => Ok(Attempt::Busy(expires_in)),
            Err(error) => Err(error),
        };
        match &result {
            // The script (after an attempt of unknown outcome) or SET NX
            // said the lock is not ours; or the script refused the request
            // (a semaphore's capacity), changing nothing.
            Ok(Attempt::Busy(_)) | Err(LockError::Config { .. }) => unknown.resolved(),
            // The attempt may still be on its way (stuck in a replaced
            // connection, or forwarded by a proxy that then reset the
            // client's side) and land later; a refused connection sent
            // nothing.
            Err(LockError::Redis { source, .. }) if !source.is_connection_refusal() => {
                unknown.stalled = true
            }
            _ => {}
        }
        // A lock whose validity was over when its reply came is no lock:
        // the attempt stays open (a later one finds the key with this token
        // and its real ttl; else it is released in the background).
        if let Ok(Attempt::Acquired(_, found, _)) = &result {
            if let Some(late) = late_reply(unknown.last_sent, *found, self.settings.ttl) {
                return Err(LockError::redis(self.name, "acquire", late));
            }
        }
        result
    }
}

/// How a lock was taken: when the key was set (the attempt's send time, or
/// earlier for a lock found already taken with the token), until when it
/// lives at least (known when found), its fencing token, and whether an
/// attempt stalled (a copy of it may still reach Redis).
pub(crate) struct TakenAt {
    pub(crate) sent_at: Instant,
    pub(crate) expires_by: Option<Instant>,
    pub(crate) fence: Option<u64>,
    pub(crate) stalled: bool,
    /// Taken by a plain `SET NX PX` (the key holds exactly the token until
    /// a waiter marks it): the release may be the server's plain
    /// conditional delete.
    pub(crate) plain: bool,
}

/// What [`Acquisition::attempt_in_line`] found.
pub(crate) enum InLine {
    /// The key, taken with the round's token.
    Taken(Arc<Hold>),
    /// Held by another holder (its key expiring after this long, when
    /// known), or free with another waiter first.
    Busy(Option<Duration>),
}

/// What [`Acquisition::first_attempt`] took.
enum Taken {
    /// The lock, its value the attempt's token.
    Plain(TakenAt),
    /// The lock, its guard made (its value is not the bare token).
    Guard(LockGuard),
}

/// An acquisition's attempts whose outcome is unknown (failed or cancelled
/// before an answer came: the lock may have been taken). Later attempts
/// check whether the lock already holds the token; if the acquisition ends
/// without the lock, the lock it may hold is released in the background.
struct Unknown<'a> {
    acquisition: &'a Acquisition<'a>,
    token: &'a str,
    /// The send time of the last attempt: the key was set no later.
    last_sent: Instant,
    /// An attempt is in flight or ended without an answer.
    open: bool,
    /// An attempt failed without an answer: it may still reach Redis later.
    stalled: bool,
}

impl<'a> Unknown<'a> {
    fn new(acquisition: &'a Acquisition<'a>, token: &'a str) -> Self {
        Unknown {
            acquisition,
            token,
            last_sent: Instant::now(),
            open: false,
            stalled: false,
        }
    }

    /// An attempt is about to be sent; returns whether an earlier one's
    /// outcome is unknown.
    fn sent(&mut self) -> bool {
        let earlier = self.open;
        self.last_sent = Instant::now();
        self.open = true;
        earlier
    }

    /// Redis said the lock is not held with this token. After an attempt
    /// that timed out this settles nothing: that attempt may still be on
    /// its way, stuck in the replaced connection, and land later.
    fn resolved(&mut self) {
        if !self.stalled {
            self.open = false;
        }
    }

    /// Redis said the lock is held with this token: the guard. Taken by this
    /// attempt, its validity counts from this attempt's send time. Found
    /// already taken (`found`: by an earlier attempt whose answer was lost,
    /// which may have landed at any time since it was sent; the key's
    /// remaining ttl), the key lives at least that remaining ttl from this
    /// attempt's send time: the hold counts as taken one ttl before that, so
    /// that its validity ends then and a renewal falls due at once.
    fn acquired(
        self,
        fence: Option<u64>,
        found: Option<Duration>,
        holds: Option<String>,
    ) -> LockGuard {
        let (acquisition, token) = (self.acquisition, self.token);
        let taken = self.settle(found, fence);
        // The hold renews and releases the value the lock holds.
        acquisition.guard(holds.unwrap_or_else(|| token.to_owned()), taken)
    }

    /// The lock is taken (`found`: it was found taken with this token, with
    /// that much ttl left): nothing is left to clean up.
    fn settle(mut self, found: Option<Duration>, fence: Option<u64>) -> TakenAt {
        self.open = false;
        let (sent_at, expires_by) = match found {
            None => (self.last_sent, None),
            Some(remaining) => {
                let expiry = self.last_sent + remaining;
                let ttl = self.acquisition.settings.ttl;
                (
                    expiry.checked_sub(ttl).unwrap_or(self.last_sent),
                    Some(expiry),
                )
            }
        };
        TakenAt {
            sent_at,
            expires_by,
            fence,
            stalled: self.stalled,
            plain: false,
        }
    }
}

impl Drop for Unknown<'_> {
    fn drop(&mut self) {
        if self.open {
            let acquired = self
                .acquisition
                .acquired(self.token.to_owned(), self.last_sent, None);
            spawn_release(
                Hold::new(Acquired {
                    hold_at_least: None,
                    linger: self.stalled,
                    ..acquired
                }),
                false,
            );
        }
    }
}

/// A waiter's place in the queue, given up when it stops waiting without
/// the lock (timed out, failed or cancelled).
struct QueuePlace<'a> {
    kind: Kind,
    core: &'a Arc<Core>,
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
        let (kind, core, keys, member) = (
            self.kind,
            Arc::clone(self.core),
            self.keys.clone(),
            self.member.clone(),
        );
        runtime.spawn(async move {
            // Best effort: a place not given up expires after WAITER_TIMEOUT.
            let _ = core.backend().leave(kind, &keys, &member).await;
        });
    }
}
