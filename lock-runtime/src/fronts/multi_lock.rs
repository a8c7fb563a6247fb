//! A set of locks held at once ([`Lock::all`]): its builder and its guard.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{ConfigError, LockError, LostCause};
use crate::fronts::lock::Lock;
use crate::lease::guard::{lost_in, LockGuard};
use crate::lease::multi::SetAcquisition;
use crate::lease::watch::{Entry, HeldLock};
use crate::lease::watch_set::watch_set;

// Here rather than in `lock.rs`: the set's builder wraps a `Lock`, so the
// single lock's module does not know the set's.
impl Lock {
    /// A set of locks taken at once, every one or none: a transfer between
    /// two accounts, a job touching two tenants. The same name twice is one
    /// lock (a transfer from an account to itself takes it once). Each name
    /// is an ordinary lock (its key, its queue, `lockctl` shows it), taken
    /// in the set's order (sorted), so two sets never wait for each other:
    /// no deadlock, whatever order the names are given in. Every option of a
    /// single lock applies to each lock of the set.
    ///
    /// ```no_run
    /// # async fn demo(from: u64, to: u64) -> Result<(), lock_runtime::LockError> {
    /// use std::time::Duration;
    /// use lock_runtime::Lock;
    ///
    /// let guard = Lock::all([format!("account:{from}"), format!("account:{to}")])
    ///     .ttl(Duration::from_secs(10))
    ///     .wait(Duration::from_secs(2))
    ///     .acquire()
    ///     .await?;
    /// // ... move the money ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// On one Redis server (and on a Redis Cluster when every name starts
    /// with the same hash tag, `{bank}:account:1`) one script takes all of
    /// them or none; elsewhere they are taken one by one, never waiting
    /// while holding any (the guide, "Several keys at once").
    pub fn all<I, S>(names: I) -> MultiLock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLock::new(names.into_iter().map(Into::into).collect(), Lock::new(""))
    }
}

/// Several locks taken at once, every one or none: made by [`Lock::all`].
///
/// Its names are sorted and deduplicated (the set's canonical order); each
/// is an ordinary exclusive lock, with the options given here.
#[derive(Clone, Debug)]
pub struct MultiLock {
    names: Vec<String>,
    /// The options of every lock of the set (its name unused).
    lock: Lock,
}

impl MultiLock {
    pub(crate) fn new(mut names: Vec<String>, lock: Lock) -> MultiLock {
        names.sort_unstable();
        names.dedup();
        MultiLock { names, lock }
    }

    fn map(mut self, with: impl FnOnce(Lock) -> Lock) -> Self {
        self.lock = with(self.lock);
        self
    }

    lock_options!();

    /// See [`Lock::fair`]: the set does not pass single-key waiters queued
    /// ahead of it (it does pass other sets' waiters: two sets each keeping
    /// its place in a queue the other needs would wait forever).
    pub fn fair(self) -> Self {
        self.map(Lock::fair)
    }

    /// See [`Lock::fencing`]: one token for the whole set, larger than every
    /// token handed out earlier for any of its keys
    /// ([`MultiGuard::fencing_token`]); every later token of each key is
    /// larger than it. A set whose every lock is already held up the call
    /// chain takes the largest of the outer holds' tokens, raises every
    /// key's fence to it, and the outer holds report it from then on.
    pub fn fencing(self) -> Self {
        self.map(Lock::fencing)
    }

    /// See [`Lock::hold_at_least`]: every key of the set is kept.
    pub fn hold_at_least(self, hold_at_least: Duration) -> Self {
        self.map(|lock| lock.hold_at_least(hold_at_least))
    }

    /// The set's names, sorted, each once.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Takes every lock of the set, or none: once when no `wait` was set
    /// ([`LockError::Busy`] names a busy lock), else waiting, woken by the
    /// release of any lock it waits for ([`LockError::WaitTimeout`]).
    ///
    /// A lock of the set already held up this task's call chain is shared
    /// as a single lock would be ([Reentrancy](crate::guide::attribute#reentrancy)); the others are
    /// taken as a set.
    ///
    /// # Errors
    ///
    /// Those of [`Lock::acquire`]; [`LockError::Config`] for an empty set.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves no lock of the set behind: locks taken are
    /// released, attempts of unknown outcome released in the background,
    /// places in queues given up.
    pub async fn acquire(&self) -> Result<MultiGuard, LockError> {
        self.traced(self.take(Entry::Guard, self.lock_wait())).await
    }

    /// Takes every lock of the set if all are free, never waiting.
    ///
    /// # Errors
    ///
    /// As [`acquire`](MultiLock::acquire) without a wait.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](MultiLock::acquire).
    pub async fn try_acquire(&self) -> Result<MultiGuard, LockError> {
        self.traced(self.take(Entry::Guard, None)).await
    }

    /// Runs `body` while holding every lock of the set, then releases them:
    /// what `#[distributed_lock(key = ["a:<x>", "b:<y>"])]` does. A renewed
    /// set whose locks one is lost stops `body` ([`LockError::Lost`] names
    /// that lock). Inside, each lock of the set is reentrant, and
    /// [`current()`](crate::current) returns the last of them.
    ///
    /// # Errors
    ///
    /// Those of [`acquire`](MultiLock::acquire), and [`LockError::Lost`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `body` and releases every lock in the
    /// background.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let guard = self
            .traced(self.take(Entry::Body, self.lock_wait()))
            .await?;
        let output = guard.run(body).await?;
        let names = self.names.join(", ");
        match guard.release().await {
            Ok(()) => {}
            // Logged (once, at warn) by the release.
            Err(LockError::Lost { .. }) => {}
            Err(error) => {
                tracing::error!(locks = %names, %error, "critical section finished, but its release failed")
            }
        }
        Ok(output)
    }

    fn lock_wait(&self) -> Option<Duration> {
        self.lock.settings().wait
    }

    async fn traced(
        &self,
        acquiring: impl Future<Output = Result<MultiGuard, LockError>>,
    ) -> Result<MultiGuard, LockError> {
        let span = tracing::info_span!(
            "lock.acquire",
            lock.name = %self.names.join(", "),
            lock.outcome = tracing::field::Empty,
            lock.waited_ms = tracing::field::Empty,
            lock.fencing_token = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = acquiring.instrument(span.clone()).await;
        let waited = started.elapsed();
        let outcome = match &result {
            Ok(_) => "acquired",
            Err(LockError::Busy { .. }) => "busy",
            Err(LockError::WaitTimeout { .. }) => "timed_out",
            Err(_) => "error",
        };
        span.record("lock.waited_ms", waited.as_millis() as u64);
        span.record("lock.outcome", outcome);
        // Each lock of the set is an acquisition, as each is a hold.
        let locks = self.names.len() as u64;
        crate::observe::acquisition(self.lock.label(), outcome, waited, locks);
        if let Some(token) = result.as_ref().ok().and_then(MultiGuard::fencing_token) {
            span.record("lock.fencing_token", token);
        }
        result
    }

    async fn take(&self, entry: Entry, wait: Option<Duration>) -> Result<MultiGuard, LockError> {
        if self.names.is_empty() {
            return Err(ConfigError::InvalidName {
                name: String::new(),
                reason: "a set of locks needs at least one name: `Lock::all([\"a\", \"b\"])`"
                    .to_owned(),
            }
            .into());
        }
        let locks: Vec<Lock> = self
            .names
            .iter()
            .map(|name| {
                let lock = self.lock.renamed(name);
                match wait {
                    Some(_) => lock,
                    None => lock.no_wait(),
                }
            })
            .collect();
        let members = locks
            .iter()
            .map(Lock::prepare)
            .collect::<Result<Vec<_>, _>>()?;
        let set = SetAcquisition {
            members,
            wait,
            started: Instant::now(),
        };
        let guards = set.take(entry).await?;
        Ok(MultiGuard { guards })
    }
}

/// Every lock of a set, held: made by [`MultiLock::acquire`]. Release it
/// with [`release`](MultiGuard::release); dropped without it, each lock is
/// released in the background (as a [`LockGuard`] is).
#[must_use = "a set's guard releases its locks as soon as it is dropped"]
pub struct MultiGuard {
    /// In the set's order.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// Each lock of the set, in the set's (sorted) order.
    pub fn locks(&self) -> impl Iterator<Item = &HeldLock> {
        self.guards.iter().map(|guard| &**guard)
    }

    /// The set's fencing token, when it was taken with
    /// [`fencing`](MultiLock::fencing): larger than every token handed out
    /// earlier for any of its keys (and every later token of each key is
    /// larger than it).
    pub fn fencing_token(&self) -> Option<u64> {
        self.guards
            .iter()
            .filter_map(|guard| guard.fencing_token())
            .max()
    }

    /// Whether every lock of the set is still held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(|guard| guard.is_held())
    }

    /// The shortest validity left among the set's locks.
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(|guard| guard.remaining())
            .min()
            .unwrap_or_default()
    }

    /// The first lock of the set found lost, and why.
    pub fn lost_cause(&self) -> Option<(&str, LostCause)> {
        self.guards
            .iter()
            .find_map(|guard| guard.lost_cause().map(|cause| (guard.name(), cause)))
    }

    /// Whether every lock of the set was already held up this task's call
    /// chain (each guard shares an outer hold).
    pub fn is_reentrant(&self) -> bool {
        self.guards.iter().all(LockGuard::is_reentrant)
    }

    /// Runs `body` under every lock of the set, without releasing them
    /// afterwards. For a renewed set with [`OnLost::Stop`](crate::OnLost)
    /// (the default), `body` is dropped as soon as any lock is lost, and
    /// this returns [`LockError::Lost`] naming it.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when a lock of the set was lost and `body` stopped.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `body`; the locks stay held.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output, LockError> {
        let span = tracing::info_span!(
            "lock.hold",
            lock.name = %self.guards.iter().map(|guard| guard.name()).collect::<Vec<_>>().join(", "),
            lock.fencing_token = tracing::field::Empty,
            lock.outcome = tracing::field::Empty,
            lock.lost_cause = tracing::field::Empty,
        );
        if let Some(token) = self.fencing_token() {
            span.record("lock.fencing_token", token);
        }
        let holds = self
            .guards
            .iter()
            .map(|guard| (Arc::clone(guard.hold()), guard.is_reentrant()))
            .collect();
        match watch_set(holds, body).instrument(span.clone()).await {
            Ok(output) => Ok(output),
            Err((index, cause)) => {
                let hold = self.guards[index].hold();
                lost_in(&span, hold, cause);
                Err(LockError::Lost {
                    name: hold.name().to_owned(),
                    cause,
                })
            }
        }
    }

    /// Releases every lock of the set (their round trips at once).
    ///
    /// # Errors
    ///
    /// The first error in the set's order: [`LockError::Lost`] naming a lock
    /// that had expired or was another holder's (the others are released
    /// all the same), [`LockError::Redis`] (retried in the background).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped release still releases, in the background.
    pub async fn release(self) -> Result<(), LockError> {
        let results = join_all(self.guards.into_iter().map(LockGuard::release)).await;
        results
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("locks", &self.locks().collect::<Vec<_>>())
            .finish()
    }
}
