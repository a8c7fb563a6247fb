//! The lock builder: what a lock is, and its public ways to be taken.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{retryable, Kind, Respect};
use crate::client::{global_client, Client};
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::lease::acquire::{Acquisition, Cohort, Representative, Settings};
use crate::lease::guard::{lost_in, LockGuard, OnLost};
use crate::lease::watch::{held_in_this_task, Entry};
use crate::lease::MAX_DURATION_MS;

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
    fair: bool,
    fencing: bool,
    hold_at_least: Option<Duration>,
    client: Option<Client>,
    /// Exclusive, unless made by [`RwLock`](crate::RwLock) or
    /// [`Semaphore`](crate::Semaphore).
    kind: Kind,
    /// The `lock` label of its metrics (default
    /// [`Lock::DEFAULT_METRIC_LABEL`]).
    metric_label: Option<Cow<'static, str>>,
    /// The function (or task) taking it, for the holder record.
    caller: Option<Cow<'static, str>>,
}

impl Lock {
    /// The ttl used when none is given: 30 seconds.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// The `lock` label of the metrics of a lock given no
    /// [`metric_label`](Lock::metric_label) nor [`caller`](Lock::caller)
    /// (which labels it when there is no `metric_label`): `unlabelled`, one series for
    /// all such locks, whatever their names (a label made from names would
    /// make one series per id).
    pub const DEFAULT_METRIC_LABEL: &'static str = crate::observe::DEFAULT_METRIC_LABEL;

    /// A lock called `name` (e.g. `"lottery:2026-11-22"`), with the default
    /// ttl, no waiting and the process-wide client.
    ///
    /// The name is used as given: format the ids into it yourself
    /// (`format!("order:{id}")`). Braces in the name itself are literal text,
    /// as in the attribute's key (where placeholders are written `<id>` and
    /// `{id}`, naming a parameter, is refused): a Redis Cluster hash tag
    /// such as `{tenant}` keeps them in one slot.
    ///
    /// ```no_run
    /// # async fn demo(id: u64, tenant: &str) -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::Lock;
    ///
    /// let order = Lock::new(format!("order:{id}")); // one lock per order
    /// let shared = Lock::new(format!("{{{tenant}}}:nightly")); // `{acme}:nightly`: a hash tag
    /// # let _ = (order, shared); Ok(()) }
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Lock {
            name: name.into(),
            ttl: Self::DEFAULT_TTL,
            wait: None,
            renew: false,
            max_hold: None,
            on_lost: None,
            fair: false,
            fencing: false,
            hold_at_least: None,
            client: None,
            kind: Kind::Exclusive,
            metric_label: None,
            caller: None,
        }
    }

    /// This lock as another kind (the read/write and semaphore fronts).
    pub(crate) fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = match kind {
            Kind::Semaphore {
                capacity, permits, ..
            } => Kind::Semaphore {
                capacity,
                permits,
                fair: self.fair,
            },
            kind => kind,
        };
        self
    }

    /// How long the lock stays held if its holder never releases it (crash,
    /// hang): Redis deletes the key after this long. Whole milliseconds (a
    /// fraction is dropped), from 1 ms to a year; a renewed lock needs at
    /// least [`MIN_RENEWED_TTL`] (10 ms). Checked when the lock is taken.
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
    /// was acquired (1 ms to a year). The lock then expires within one ttl and the holder is
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

    /// Waiters get the lock strictly in the order they arrived: nobody
    /// takes it ahead of the queue, not even a newcomer finding it free.
    /// (Without `fair`, waiters are also queued and woken one at a time in
    /// arrival order, but a newcomer may take a free lock first.) Same
    /// scripts and round trips; a crashed first waiter in line stalls the
    /// queue until its place expires (2 s). Use it for every lock of a key,
    /// or for none.
    pub fn fair(mut self) -> Self {
        self.fair = true;
        if let Kind::Semaphore { fair, .. } = &mut self.kind {
            *fair = true;
        }
        self
    }

    /// Issue a fencing token with each acquisition:
    /// [`fencing_token()`](crate::HeldLock::fencing_token) on the guard or on
    /// [`current()`](crate::current) returns a number larger than every token
    /// handed out earlier for this key. Pass it with every write to a store
    /// that rejects a write carrying a smaller token than one it has seen: a
    /// holder paused past its ttl then cannot overwrite its successor's work.
    ///
    /// Costs the acquire a Lua script instead of a plain `SET NX PX` (still
    /// one round trip) and a second key, `<lock key>:fence`, kept for
    /// max(60 s, ttl) after the last acquisition. Use it for every lock of a
    /// key that a store checks, so that every writer carries a token.
    pub fn fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// On release, keep the lock until at least this long after it was
    /// acquired (the release shortens the key's expiry to the remainder
    /// instead of deleting it). Stops a fast scheduled job from running twice
    /// when the instances' schedulers fire a little apart. 1 ms to a year.
    /// The kept key no longer answers to this holder's token: no renewal or
    /// release of this acquisition can extend or shorten it.
    pub fn hold_at_least(mut self, hold_at_least: Duration) -> Self {
        self.hold_at_least = Some(hold_at_least);
        self
    }

    /// Use this client instead of the process-wide one.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The `lock` label of this lock's metrics (the guide, "Metrics"): name
    /// the *kind* of lock, never one of its ids, so that the label has a
    /// bounded set of values: `Lock::new(format!("order:{id}"))
    /// .metric_label("order:<id>")`. `#[distributed_lock]` labels its locks
    /// with their key as written (`order:<id>`). Default: the
    /// [`caller`](Lock::caller) when one is given, else
    /// [`Lock::DEFAULT_METRIC_LABEL`], one series for every lock given
    /// neither.
    pub fn metric_label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.metric_label = Some(label.into());
        self
    }

    /// What takes the lock, as lockctl shows it beside the holder's
    /// instance, host and process (the holder record, the guide, "Operating:
    /// lockctl"): a function path such as `"billing::charge"`, or a job's
    /// name. `#[distributed_lock]` names the annotated function. Costs
    /// nothing on the way to Redis: the record is written in the background.
    pub fn caller(mut self, caller: impl Into<Cow<'static, str>>) -> Self {
        self.caller = Some(caller.into());
        self
    }

    /// The lock's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `lock` label of its metrics: its `metric_label`, else its
    /// `caller`, else [`Lock::DEFAULT_METRIC_LABEL`].
    pub(crate) fn label(&self) -> &str {
        self.metric_label
            .as_deref()
            .or(self.caller.as_deref())
            .unwrap_or(Self::DEFAULT_METRIC_LABEL)
    }

    /// Takes the lock: once when no `wait` was set, else waiting until the
    /// wait runs out, woken by the holder's release.
    ///
    /// Inside a body that already holds this lock (an annotated function, or
    /// a body run by [`Lock::run`] / [`LockGuard::run`], in the same task),
    /// this succeeds at once with a guard that shares the outer hold: its
    /// release does nothing, and the lock is released when the outermost
    /// holder exits.
    ///
    /// # Errors
    ///
    /// - [`LockError::Busy`]: held by another holder and no `wait` was set;
    ///   [`LockError::WaitTimeout`]: still held when the wait ran out.
    /// - [`LockError::Redis`]: Redis unreachable or failing, or over a quorum
    ///   too few nodes answering (for a waiter, only once its wait is over: it
    ///   keeps trying until then, and returns the last error at most one call
    ///   deadline, `connect_timeout + response_timeout`, after the wait).
    /// - [`LockError::NotReplicated`]: acknowledged mode, replicas did not
    ///   confirm in time (the lock was given back).
    /// - [`LockError::Lost`]: a reentrant entry whose outer hold was lost.
    /// - [`LockError::Config`]: a setting out of range or a reentrant entry
    ///   that cannot share the outer hold ([`ConfigError`](crate::ConfigError)),
    ///   before anything is sent.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no lock behind: an attempt in flight whose
    /// outcome is unknown is released in the background, and a waiter's place
    /// in the queue is given up.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.traced(|| self.take(Entry::Guard)).await
    }

    /// The acquisition `acquiring` makes, inside the `lock.acquire` span,
    /// whose fields say how it ended (the guide, "Tracing"). A closure, not
    /// a future: this future then holds the acquisition's future once (as
    /// what it awaits), not twice (also as its argument).
    async fn traced<F: Future<Output = Result<LockGuard, LockError>>>(
        &self,
        acquiring: impl FnOnce() -> F,
    ) -> Result<LockGuard, LockError> {
        let span = tracing::info_span!(
            "lock.acquire",
            lock.name = %self.name,
            lock.outcome = tracing::field::Empty,
            lock.waited_ms = tracing::field::Empty,
            lock.holder = tracing::field::Empty,
            lock.fencing_token = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = in_span!(span, acquiring());
        let (waited, outcome) = (started.elapsed(), acquire_outcome(&result));
        span.record("lock.waited_ms", waited.as_millis() as u64);
        span.record("lock.outcome", outcome);
        crate::observe::acquisition(self.label(), outcome, waited, 1);
        // A scheduled job's lock (`hold_at_least`) found busy may be kept,
        // not held: said so (one more read, on this path alone), within
        // the acquisition's bound (its wait and one call deadline: lock-sim
        // cluster seed 101, a try of a job's lock whose read met a
        // connection that had stopped answering, 1,265 ms against 1,188).
        let result = match result {
            Err(LockError::Busy { name })
                if self.hold_at_least.is_some() && self.kind == Kind::Exclusive =>
            {
                Err(self.busy_or_kept(name, started).await)
            }
            result => result,
        };
        if let (Ok(guard), false) = (&result, span.is_disabled()) {
            span.record(
                "lock.holder",
                tracing::field::display(guard.hold().token_head()),
            );
            if let Some(token) = guard.fencing_token() {
                span.record("lock.fencing_token", token);
            }
        }
        result
    }

    /// `Busy`, or `Kept` when the key is a kept one (`kept:<token>`), as
    /// read by the deadline of an acquisition that began at `started`
    /// (plain `Busy` after it).
    async fn busy_or_kept(&self, name: String, started: Instant) -> LockError {
        let deadline = match self.client_ref() {
            Some(client) => client.core().call_deadline(),
            None => global_client().map_or(Duration::ZERO, |client| client.core().call_deadline()),
        };
        let until = started + self.wait.unwrap_or_default() + deadline;
        match tokio::time::timeout_at(until, self.holder()).await {
            Ok(Ok(Some(holder))) if holder.kept => LockError::Kept {
                name,
                remaining: holder.expires_in,
            },
            _ => LockError::Busy { name },
        }
    }

    /// `acquire`, for a guard that is a manual one or runs a body.
    async fn take(&self, entry: Entry) -> Result<LockGuard, LockError> {
        let acquisition = self.prepare()?;
        if let Some(scope) = &acquisition.held {
            // Boxed, like waiting: a rare path that should not size the
            // common one's future.
            return Box::pin(acquisition.reentered(scope, entry)).await;
        }
        let Some(wait) = self.wait else {
            return acquisition.once_final().await;
        };
        let started = Instant::now();
        let respect = acquisition.respects_queue();
        // Tasks of one client waiting for one key queue in the process
        // behind one of them (`cohort.rs`); `fair` locks, and the kinds
        // other than the exclusive lock, queue in Redis only.
        // Nor do locks whose backend passes none in the process
        // (acknowledged mode), nor fenced ones where a pass carries no
        // fencing token (a quorum).
        let backend = acquisition.core.backend();
        let cohorts = (!self.fair
            && self.kind == Kind::Exclusive
            && backend.passes_in_process()
            && (!self.fencing || backend.passes_fenced_in_process()))
        .then(|| acquisition.core.cohorts());
        let in_cohort = cohorts.is_some_and(|cohorts| cohorts.exists(&acquisition.keys.lock));
        // No attempt is sent once the wait is over: a call ends at most one
        // call deadline after the end of its wait (a first attempt that
        // timed out on a silent server must not be followed by another).
        let over = || {
            started
                .checked_add(wait)
                .is_some_and(|end| Instant::now() >= end)
        };
        let timed_out = || LockError::WaitTimeout {
            name: self.name.clone(),
            waited: started.elapsed(),
        };
        if !respect.any() && !self.fencing && !in_cohort {
            // A free lock costs a waiting acquire what it costs a try: one
            // plain `SET NX PX`, and no cohort. Only a busy lock (or a failed
            // connection) goes on to the cohort and the queue.
            match acquisition.once().await {
                Err(LockError::Busy { .. }) if over() => return Err(timed_out()),
                Err(LockError::Busy { .. }) => {}
                Err(LockError::Redis { source, .. }) if retryable(&source) && !over() => {}
                result => return result,
            }
        }
        let mut representative = None;
        if cohorts.is_some() {
            match Box::pin(acquisition.join_cohort(started, wait)).await? {
                Cohort::Passed(guard) => return Ok(guard),
                Cohort::LastTry => {
                    return match acquisition.once().await {
                        Err(error) if error.is_busy() => Err(timed_out()),
                        result => result,
                    }
                }
                Cohort::Representative(_) if over() => return Err(timed_out()),
                Cohort::Representative(slot) => representative = Some(slot),
            }
        }
        // After its cohort ended (maybe at the starvation bound, whose
        // release woke a waiter of another client), the first attempt lets
        // queued waiters go first.
        let after_dissolve = representative
            .as_ref()
            .is_some_and(|slot| slot.after_dissolve);
        let respect = if after_dissolve {
            Respect::Everyone
        } else {
            respect
        };
        // Boxed: the waiting state machine is large, and an uncontended
        // acquire should not carry it.
        let in_redis = Box::pin(acquisition.waiting(wait, started, respect));
        let mut guard = match &representative {
            // Its waiters give up a representative that stops being polled.
            Some(slot) => {
                Heartbeat {
                    inner: in_redis,
                    slot,
                }
                .await?
            }
            None => in_redis.await?,
        };
        if let Some(slot) = representative {
            slot.keep(&mut guard);
        }
        Ok(guard)
    }

    /// Takes the lock if it is free, in one round trip; never waits.
    /// Reentrant like [`acquire`](Lock::acquire).
    ///
    /// ```no_run
    /// # async fn rebuild_index() {}
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use lock_runtime::Lock;
    ///
    /// match Lock::new("reindex").try_acquire().await {
    ///     Ok(guard) => {
    ///         rebuild_index().await;
    ///         guard.release().await?;
    ///     }
    ///     Err(error) if error.is_busy() => println!("another instance is reindexing"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lock::acquire) without a wait: [`LockError::Busy`] when
    /// another holder has it, [`LockError::Redis`], [`LockError::Config`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Lock::acquire): a dropped attempt leaves no lock behind.
    pub async fn try_acquire(&self) -> Result<LockGuard, LockError> {
        self.traced(|| async {
            let acquisition = self.prepare()?;
            if let Some(scope) = &acquisition.held {
                return Box::pin(acquisition.reentered(scope, Entry::Guard)).await;
            }
            acquisition.once_final().await
        })
        .await
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
    /// done, and the loss is logged once, at warn level, in the `lock.hold`
    /// span.
    ///
    /// ```no_run
    /// # async fn load_users() -> Vec<u64> { vec![7, 42] }
    /// # async fn demo() -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::Lock;
    ///
    /// // What `#[distributed_lock(key = "lottery:<day>", ttl = "10s", wait = "2s")]` does.
    /// let day = "2026-11-26";
    /// let winners = Lock::new(format!("lottery:{day}"))
    ///     .ttl(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(2))
    ///     .run(async { load_users().await.into_iter().take(10).collect::<Vec<_>>() })
    ///     .await?;
    /// # let _ = winners; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`acquire`](Lock::acquire) (the body did not run), and
    /// [`LockError::Lost`] when a renewed lock was lost while the body ran
    /// (with [`OnLost::Stop`](crate::OnLost::Stop) the body was stopped).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the body where it stands and releases the
    /// lock in the background (renewals stop first).
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let guard = self.traced(|| self.take(Entry::Body)).await?;
        // The hold's span covers the release too: it records how the hold
        // ended, and a loss found by the release is logged inside it.
        let span = guard.hold_span();
        let output = guard.run_in(&span, body).await?;
        let hold = Arc::clone(guard.hold());
        match in_span!(span, guard.release()) {
            Ok(()) => {
                span.record("lock.outcome", "released");
            }
            // Logged (once, at warn) in the span by the release.
            Err(LockError::Lost { cause, .. }) => lost_in(&span, &hold, cause),
            Err(error) => {
                span.record("lock.outcome", "error");
                span.in_scope(|| {
                    tracing::error!(lock = %self.name, %error, "critical section finished, but its release failed")
                });
            }
        }
        Ok(output)
    }

    /// Checks every setting before anything is sent: a lock that cannot be
    /// held as described fails here, with what to change.
    fn check(&self) -> Result<u64, LockError> {
        let name = &self.name;
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 || ttl_ms > MAX_DURATION_MS {
            return Err(ConfigError::InvalidTtl {
                name: name.to_string(),
                ttl: self.ttl,
                reason: "it must be from 1 ms to a year (8760 h)",
            }
            .into());
        }
        if self.renew && self.ttl < MIN_RENEWED_TTL {
            return Err(ConfigError::InvalidTtl {
                name: name.to_string(),
                ttl: self.ttl,
                reason: "a renewed lock needs a ttl of at least `MIN_RENEWED_TTL`, 10 ms (it is \
                         renewed every ttl/3, and its validity is the ttl less a 1 % + 2 ms \
                         drift margin)",
            }
            .into());
        }
        let invalid = |option: &'static str, reason: String| -> LockError {
            ConfigError::InvalidLockOption {
                name: name.to_string(),
                option,
                reason,
            }
            .into()
        };
        let in_range = |option: &'static str, value: Option<Duration>| match value {
            Some(value)
                if value < Duration::from_millis(1)
                    || value.as_millis() > u128::from(MAX_DURATION_MS) =>
            {
                Err(invalid(
                    option,
                    format!(
                        "{} is out of range: give it from 1 ms to a year (8760 h)",
                        crate::error::Readable(value)
                    ),
                ))
            }
            _ => Ok(()),
        };
        in_range("max_hold", self.max_hold)?;
        in_range("hold_at_least", self.hold_at_least)?;
        match self.kind {
            Kind::Read if self.hold_at_least.is_some() => {
                return Err(invalid(
                    "hold_at_least",
                    "it only applies to an exclusive or write lock (a kept read share would \
                     hold writers off): remove it from the read lock"
                        .to_owned(),
                ))
            }
            Kind::Semaphore {
                capacity, permits, ..
            } => {
                if self.fencing || self.hold_at_least.is_some() {
                    let option = if self.fencing {
                        "fencing"
                    } else {
                        "hold_at_least"
                    };
                    return Err(invalid(
                        option,
                        "fencing and hold_at_least only apply to exclusive and read/write \
                         locks: remove them from the semaphore"
                            .to_owned(),
                    ));
                }
                if capacity == 0 || permits == 0 || permits > capacity {
                    return Err(invalid(
                        "permits",
                        format!(
                            "the semaphore has {capacity} permits and this call takes \
                             {permits}: a semaphore needs at least 1 permit, and a call takes \
                             from 1 to all of them"
                        ),
                    ));
                }
            }
            _ => {}
        }
        if !self.renew && (self.max_hold.is_some() || self.on_lost.is_some()) {
            let option = if self.max_hold.is_some() {
                "max_hold"
            } else {
                "on_lost"
            };
            return Err(invalid(
                option,
                "max_hold and on_lost only apply to renewed locks: add `.renew()`".to_owned(),
            ));
        }
        Ok(ttl_ms)
    }

    /// The client set with [`Lock::client`], if any.
    pub(crate) fn client_ref(&self) -> Option<&Client> {
        self.client.as_ref()
    }

    /// This lock without a wait (a set's try).
    pub(crate) fn no_wait(mut self) -> Lock {
        self.wait = None;
        self
    }

    /// This lock's options under another name (a member of a set).
    pub(crate) fn renamed(&self, name: &str) -> Lock {
        Lock {
            name: name.to_owned(),
            ..self.clone()
        }
    }

    pub(crate) fn prepare(&self) -> Result<Acquisition<'_>, LockError> {
        let ttl_ms = self.check()?;
        let client = match &self.client {
            Some(client) => client.clone(),
            None => global_client()?,
        };
        let core = Arc::clone(client.core());
        let keys = LockKeys::new(core.key_prefix(), &self.name, self.kind.key_suffix())?;
        // A semaphore counts acquisitions, not tasks: taken again inside its
        // own body, it takes more permits.
        let reentrant = !matches!(self.kind, Kind::Semaphore { .. });
        Ok(Acquisition {
            name: &self.name,
            label: self.metric_label.as_ref(),
            caller: self.caller.as_ref(),
            settings: self.settings(),
            held: reentrant.then(|| held_in_this_task(&core, &keys)).flatten(),
            core,
            keys,
            ttl_ms,
            deadline: self.wait.and_then(|wait| Instant::now().checked_add(wait)),
        })
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            kind: self.kind,
            // Whole milliseconds, as Redis holds it: validity is never
            // counted from a longer ttl than the key's.
            ttl: Duration::from_millis(self.ttl.as_millis().min(u128::from(MAX_DURATION_MS)) as u64),
            renew: self.renew,
            max_hold: self.max_hold,
            on_lost: self.on_lost.unwrap_or_default(),
            fair: self.fair,
            fencing: self.fencing,
            hold_at_least: self.hold_at_least,
            wait: self.wait,
        }
    }
}

pin_project_lite::pin_project! {
    /// A representative's acquire in Redis, showing a sign of life to its
    /// cohort at every poll.
    struct Heartbeat<'a, F> {
        #[pin]
        inner: F,
        slot: &'a Representative<'a>,
    }
}

impl<F: Future> Future for Heartbeat<'_, F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        this.slot.heartbeat();
        this.inner.poll(cx)
    }
}

/// The shortest ttl of a renewed lock: renewed every ttl/3, valid for the
/// ttl less its drift margin (1 % + 2 ms). The attribute checks it at
/// compile time.
pub const MIN_RENEWED_TTL: Duration = Duration::from_millis(10);

/// The `lock.outcome` of an acquisition.
fn acquire_outcome(result: &Result<LockGuard, LockError>) -> &'static str {
    match result {
        Ok(_) => "acquired",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::WaitTimeout { .. }) => "timed_out",
        Err(_) => "error",
    }
}
