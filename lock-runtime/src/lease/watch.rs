//! Running a body under a held lock: `current()` inside it, and, for a
//! renewed lock, stopping it the moment the lock's validity is gone.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

use crate::error::LostCause;
use crate::keys::LockKeys;
use crate::lease::hold::Hold;
use crate::lease::Core;

/// A body running under a held lock: the locks held up this task's call
/// chain form a chain of scopes, innermost first.
pub(crate) struct Scope {
    hold: Arc<Hold>,
    outer: Option<Arc<Scope>>,
    /// The Tokio task polling the body now (`None` outside any task: the
    /// future given to `Runtime::block_on`), updated at every poll, so a
    /// body moved to another task keeps its chain. A future polled inside
    /// the body by another task (a `LocalSet` driven by the body) is not
    /// part of the chain, although it sees the task-local.
    task: AtomicU64,
    /// The entry permits: a reentrant entry of this scope's lock holds all
    /// of them (a read entry of a read/write lock: one) for as long as it
    /// lasts, so that concurrent entries of one task (`join!`, `select!`,
    /// `FuturesUnordered`) exclude each other as entries from other tasks
    /// do, while read entries share.
    entry: Semaphore,
    /// How many entries from manual guards ([`Entry::Guard`]) hold permits.
    guards: AtomicU32,
    /// The body reads: it runs under a read share, or under a read entry of
    /// a write hold (a write inside it would run beside its sibling reads).
    reads: bool,
}

/// A scope's entry permits, all of which an exclusive entry takes.
const ENTRY_PERMITS: u32 = 1 << 20;

/// A reentrant entry's hold on its scope's permits.
#[derive(Clone, Copy)]
pub(crate) struct Entered {
    entry: Entry,
    /// A read entry: one permit, shared with other read entries.
    shared: bool,
}

impl Entered {
    pub(crate) fn new(entry: Entry, shared: bool) -> Entered {
        Entered { entry, shared }
    }

    /// A read entry.
    pub(crate) fn is_shared(self) -> bool {
        self.shared
    }

    fn permits(self) -> u32 {
        if self.shared {
            1
        } else {
            ENTRY_PERMITS
        }
    }
}

/// What a reentrant entry is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A body run under the lock (`Lock::run`, the attribute): code nested
    /// in it runs in its own scope.
    Body = 1,
    /// A guard from `acquire()`: code after it runs in the same scope, so an
    /// entry finding the permit taken by it cannot tell nesting from
    /// concurrency.
    Guard = 2,
}

impl Scope {
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// Whether the body of this scope reads (see the field).
    pub(crate) fn reads(&self) -> bool {
        self.reads
    }

    /// Takes this scope's entry permits at once, if they are free.
    pub(crate) fn try_enter(&self, entered: Entered) -> bool {
        let taken = self
            .entry
            .try_acquire_many(entered.permits())
            .map(SemaphorePermit::forget)
            .is_ok();
        if taken {
            self.entered(entered);
        }
        taken
    }

    /// Takes this scope's entry permits within `wait`. Returns false when
    /// they stayed taken. Give them back with [`leave`](Scope::leave).
    pub(crate) async fn enter(&self, entered: Entered, wait: Duration) -> bool {
        let taken = tokio::time::timeout(wait, self.entry.acquire_many(entered.permits()))
            .await
            .ok()
            .and_then(Result::ok)
            .map(SemaphorePermit::forget)
            .is_some();
        if taken {
            self.entered(entered);
        }
        taken
    }

    fn entered(&self, entered: Entered) {
        if entered.entry == Entry::Guard {
            self.guards.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Whether a manual guard holds permits.
    pub(crate) fn entered_by_guard(&self) -> bool {
        self.guards.load(Ordering::Acquire) > 0
    }

    pub(crate) fn leave(&self, entered: Entered) {
        if entered.entry == Entry::Guard {
            self.guards.fetch_sub(1, Ordering::AcqRel);
        }
        self.entry.add_permits(entered.permits() as usize);
    }

    fn task(&self) -> u64 {
        self.task.load(Ordering::Relaxed)
    }

    /// A new scope of `hold`, nested in `outer`: the chain of a body run
    /// under several locks at once (`watch_set.rs`) has one scope per lock.
    pub(super) fn nested(hold: Arc<Hold>, outer: Option<Arc<Scope>>, reads: bool) -> Arc<Scope> {
        Arc::new(Scope {
            hold,
            outer,
            task: AtomicU64::new(this_task()),
            entry: Semaphore::const_new(ENTRY_PERMITS as usize),
            guards: AtomicU32::new(0),
            reads,
        })
    }

    /// Records the task polling the body now.
    pub(super) fn polled_by(&self, task: u64) {
        if self.task() != task {
            self.task.store(task, Ordering::Relaxed);
        }
    }
}

tokio::task_local! {
    static CURRENT: Arc<Scope>;
}

/// The Tokio task running now, as a number (0 outside any task). Tokio's
/// task `Id` is a non-zero integer with no public accessor; its `Hash`
/// writes that integer, which this hasher keeps as it is.
pub(super) fn this_task() -> u64 {
    use std::hash::{Hash, Hasher};

    #[derive(Default)]
    struct Keep(u64);

    impl Hasher for Keep {
        fn write(&mut self, bytes: &[u8]) {
            // Not how `Id` hashes today; kept exact for up to 8 bytes.
            for &byte in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(byte);
            }
        }

        fn write_u64(&mut self, value: u64) {
            self.0 = value;
        }

        fn finish(&self) -> u64 {
            self.0
        }
    }

    tokio::task::try_id().map_or(0, |id| {
        let mut keep = Keep::default();
        id.hash(&mut keep);
        keep.finish()
    })
}

/// The scope of the body running now, if any.
pub(super) fn current_scope() -> Option<Arc<Scope>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// `body`, run with `scope` as its task's current scope.
pub(super) fn in_scope<F: Future>(scope: Arc<Scope>, body: F) -> TaskLocalFuture<Arc<Scope>, F> {
    CURRENT.scope(scope, body)
}

/// The innermost scope of this lock (same client, same key) up this task's
/// call chain, if any.
pub(crate) fn held_in_this_task(core: &Arc<Core>, keys: &LockKeys) -> Option<Arc<Scope>> {
    CURRENT
        .try_with(|scope| {
            let mut scope = Some(scope);
            while let Some(current) = scope {
                if current.hold.same_lock(core, keys) {
                    return (current.task() == this_task()).then(|| Arc::clone(current));
                }
                scope = current.outer.as_ref();
            }
            None
        })
        .ok()
        .flatten()
}

/// The lock held by the body that is running now, if any.
///
/// Inside an annotated function's body (or a body run by
/// [`Lock::run`](crate::Lock::run) or [`LockGuard::run`](crate::LockGuard::run))
/// this returns the held lock; elsewhere `None`. It belongs to the task
/// running the body: a task the body spawns (`tokio::spawn`, or
/// `spawn_local` on a `LocalSet` the body drives) does not see it.
///
/// ```no_run
/// # async fn charge() {}
/// #[lock_runtime::distributed_lock(key = "payout", ttl = "10s", renew)]
/// async fn payout() {
///     let lock = lock_runtime::current().expect("inside the body");
///     if lock.is_held() && lock.remaining() > std::time::Duration::from_secs(1) {
///         charge().await;
///     }
/// }
/// ```
pub fn current() -> Option<HeldLock> {
    CURRENT
        .try_with(|scope| {
            (scope.task() == this_task()).then(|| HeldLock {
                hold: Arc::clone(&scope.hold),
            })
        })
        .ok()
        .flatten()
}

/// A held lock as its holder sees it: identity and local validity.
///
/// A [`LockGuard`](crate::LockGuard) dereferences to one; inside a body,
/// [`current()`] returns one.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{HeldLock, Lock};
///
/// fn describe(lock: &HeldLock) {
///     println!(
///         "{} (Redis key {}) held with token {}, valid for at least {:?} more",
///         lock.name(),
///         lock.redis_key(),
///         lock.token(),
///         lock.remaining(),
///     );
/// }
///
/// let guard = Lock::new("order:42").acquire().await?;
/// describe(&guard);
/// guard.release().await?;
///
/// Lock::new("order:43")
///     .run(async {
///         let lock = lock_runtime::current().expect("inside the body");
///         describe(&lock);
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HeldLock {
    pub(crate) hold: Arc<Hold>,
}

impl HeldLock {
    /// The lock's name, as given (the rendered key of the attribute).
    pub fn name(&self) -> &str {
        self.hold.name()
    }

    /// The Redis key holding the lock, e.g. `lock:{order:42}`.
    pub fn redis_key(&self) -> &str {
        &self.hold.keys.lock
    }

    /// This acquisition's random token: the value stored in the key
    /// (followed by `|<channel>|<token>`, the first queued waiter's entry,
    /// while waiters are queued behind this holder). Over a quorum, the
    /// value the winning attempt wrote on the nodes, `<token>|q<attempt>`.
    pub fn token(&self) -> &str {
        &self.hold.token
    }

    /// The ttl the lock was taken with.
    pub fn ttl(&self) -> Duration {
        self.hold.ttl
    }

    /// This acquisition's fencing token, when the lock was taken with
    /// [`fencing`](crate::Lock::fencing) (`None` otherwise): larger than
    /// every token handed out earlier for the same key. Pass it with every
    /// write to a store that can reject a write carrying a smaller token than
    /// one it has seen.
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fencing()
    }

    /// Whether the lock is renewed by the watchdog.
    pub fn is_renewed(&self) -> bool {
        self.hold.renewed
    }

    /// A lower bound on how long the lock stays valid, from the holder's
    /// monotonic clock: from the send time of the last confirmed acquire or
    /// renewal, plus ttl, minus a drift margin (1 % + 2 ms). Zero once lost.
    pub fn remaining(&self) -> Duration {
        self.hold.remaining()
    }

    /// Whether the lock is still held: not found lost by a renewal, and its
    /// validity not run out.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Why the lock was lost, once it is.
    pub fn lost_cause(&self) -> Option<LostCause> {
        self.hold.lost_cause(Instant::now())
    }

    /// Simulation (feature `simulation`, not a public API): the instant
    /// (tokio's clock, virtual under a simulation's paused time) at which
    /// the holder's validity ends, as [`remaining`](Self::remaining) counts
    /// it now: the library's own account of its hold, for the simulation's
    /// checkers. Later renewals may move it forward, never back.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// Simulation (feature `simulation`, not a public API): when the loss
    /// of the lock was recorded (a renewal that found its key gone or
    /// another's, ...), if it was: the holder is told from then on.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn lost_at(&self) -> Option<Instant> {
        self.hold.lost_at()
    }

    /// Simulation (feature `simulation`, not a public API): whether the
    /// lock was handed to this holder by another task of its client (an
    /// in-process pass), not taken from Redis by its own acquisition.
    #[cfg(feature = "simulation")]
    #[doc(hidden)]
    pub fn passed_in_process(&self) -> bool {
        self.hold.passed_in_process()
    }
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLock")
            .field("name", &self.name())
            .field("token", &self.token())
            .field("fencing_token", &self.fencing_token())
            .field("remaining", &self.remaining())
            .field("renewed", &self.is_renewed())
            .finish()
    }
}

pin_project! {
    /// A body that sees its lock through `current()` and is dropped unpolled
    /// once the lock is lost (when `stop_on_loss`) or, for a reentrant entry,
    /// once the outer hold it shares has ended.
    pub(crate) struct Watched<F: Future> {
        #[pin]
        body: TaskLocalFuture<Arc<Scope>, F>,
        scope: Arc<Scope>,
        #[pin]
        deadline: tokio::time::Sleep,
        // Woken when the hold is lost or released; `None` when neither
        // stops the body.
        signal: Option<Pin<Box<OwnedNotified>>>,
        hold: Arc<Hold>,
        stop_on_loss: bool,
        reentrant: bool,
        // A renewed lock under `OnLost::Continue`: the body goes on, and a
        // loss is logged (once, at warn, in the hold's span) when it is
        // seen, not when the body ends. Cleared once logged.
        warn_on_loss: bool,
    }
}

/// Runs `body` as a new scope of `hold`. `reentrant`: the hold is shared
/// with an outer scope, whose end stops the body. `reads`: the body runs
/// under a read share or a read entry.
pub(crate) fn watch<F: Future>(
    hold: Arc<Hold>,
    stop_on_loss: bool,
    reentrant: bool,
    reads: bool,
    body: F,
) -> Watched<F> {
    let scope = Scope::nested(Arc::clone(&hold), current_scope(), reads);
    let warn_on_loss = hold.renewed && !stop_on_loss && !reentrant;
    Watched {
        body: CURRENT.scope(Arc::clone(&scope), body),
        scope,
        deadline: tokio::time::sleep_until(hold.valid_until()),
        signal: (stop_on_loss || reentrant || warn_on_loss).then(|| hold.loss_signal()),
        hold,
        stop_on_loss,
        reentrant,
        warn_on_loss,
    }
}

/// Why a body run under `hold` must stop now, if it must.
pub(super) fn stop_cause(hold: &Hold, stop_on_loss: bool, reentrant: bool) -> Option<LostCause> {
    if stop_on_loss {
        // Against the clock too, not only on news from Redis: a process
        // resumed after a pause past the deadline takes no further step.
        hold.lost_cause(Instant::now())
    } else if reentrant {
        hold.reported_loss()
            .filter(|cause| *cause == LostCause::Released)
    } else {
        None
    }
}

impl<F: Future> Future for Watched<F> {
    type Output = Result<F::Output, LostCause>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        this.scope.polled_by(this_task());
        if let Some(signal) = this.signal.as_mut() {
            // Registered before the check below, so that a loss recorded
            // between the two still wakes this task.
            if signal.as_mut().poll(cx).is_ready() {
                *signal = this.hold.loss_signal();
                let _ = signal.as_mut().poll(cx);
            }
        }
        if let Some(cause) = stop_cause(this.hold, *this.stop_on_loss, *this.reentrant) {
            return Poll::Ready(Err(cause));
        }
        if *this.warn_on_loss {
            if let Some(cause) = this.hold.lost_cause(Instant::now()) {
                *this.warn_on_loss = false;
                *this.signal = None;
                if cause != LostCause::Released {
                    // Polled inside the `lock.hold` span: the line and the
                    // span name the lock; the body runs on.
                    let span = tracing::Span::current();
                    span.record("lock.lost_cause", cause.label());
                    this.hold.count_loss_running_on(cause);
                }
            }
        }
        if let Poll::Ready(output) = this.body.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if *this.stop_on_loss || *this.warn_on_loss {
            let until = this.hold.valid_until();
            if this.deadline.deadline() != until {
                this.deadline.as_mut().reset(until);
            }
            if this.deadline.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}
