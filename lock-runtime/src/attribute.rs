//! What [`#[distributed_lock]`](crate::distributed_lock) needs of the
//! annotated function's types.
//!
//! You never call these: the attribute's expansion does. They are public so
//! that a compile error can name them and you can read here what they ask
//! for:
//!
//! - the return type implements [`NotAcquired`]: `Result<T, E>` (any path
//!   ending in `Result`: `io::Result<T>`, `anyhow::Result<T>`, an alias of
//!   yours), `Option<T>` or `()`;
//! - for `Result<T, E>`, the error type `E` implements [`FromLockError`], that
//!   is `From<LockError>`: [`LockError`] itself, `std::io::Error`,
//!   `anyhow::Error`, or your own error type with an
//!   `impl From<lock_runtime::LockError>`;
//! - the `client = <expr>` expression implements [`LockClient`]: a
//!   [`Client`], `&Client`, `Arc<Client>`, `Box<Client>`, or anything else
//!   that is `AsRef<Client>`.
//!
//! ```rust,no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! #[derive(Debug)]
//! enum JobError {
//!     Lock(LockError),
//!     Io(std::io::Error),
//! }
//!
//! // What makes `Result<_, JobError>` a return type the attribute can use.
//! impl From<LockError> for JobError {
//!     fn from(error: LockError) -> Self {
//!         JobError::Lock(error)
//!     }
//! }
//!
//! #[distributed_lock(key = "job:<day>", ttl = "1m")]
//! async fn job(day: u32) -> Result<(), JobError> {
//!     std::fs::write(format!("/tmp/job-{day}"), b"done").map_err(JobError::Io)
//! }
//! ```

use std::future::Future;

use crate::client::Client;
use crate::error::{LockError, LostCause};
use crate::fronts::lock::Lock;
use crate::fronts::multi_lock::MultiLock;

/// How a return type says "the lock was not acquired, the body did not run"
/// (or, for a renewed lock, "the lock was lost, the body was stopped").
///
/// Implemented for `Result<T, E>` (returns `Err(E::from(error))`),
/// `Option<T>` (returns `None`) and `()`; for the last two the reason is
/// logged with `tracing`: a busy lock at info level (another instance doing
/// the work is the normal case), anything else at error level (a loss was
/// already logged once, at warn).
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot report a lock that was not acquired through `{Self}`",
    label = "this return type has no way to say the body did not run",
    note = "return `Result<T, E>` with `E: From<lock_runtime::LockError>`, `Option<T>` or `()`"
)]
pub trait NotAcquired: Sized {
    /// What carries the [`LockError`]: `E` for `Result<T, E>`, the
    /// `LockError` itself for `Option<T>` and `()` (which log it).
    type Error;

    /// The value returned instead of running the body. `function` is the
    /// annotated function's path, for the log.
    fn not_acquired(error: LockError, function: &'static str) -> Self
    where
        Self::Error: FromLockError;
}

impl<T, E> NotAcquired for Result<T, E> {
    type Error = E;

    fn not_acquired(error: LockError, function: &'static str) -> Self
    where
        E: FromLockError,
    {
        tracing::debug!(function, %error, "lock not acquired; body skipped");
        Err(E::from_lock_error(error))
    }
}

impl<T> NotAcquired for Option<T> {
    type Error = LockError;

    fn not_acquired(error: LockError, function: &'static str) -> Self {
        log_skip(&error, function);
        None
    }
}

impl NotAcquired for () {
    type Error = LockError;

    fn not_acquired(error: LockError, function: &'static str) {
        log_skip(&error, function);
    }
}

/// An error type a `Result` return type can carry a [`LockError`] in: every
/// type that implements `From<LockError>` (this trait is implemented for all
/// of them; implement `From`, not this).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry a `LockError`: when the lock is not acquired, \
               `#[distributed_lock]` returns `Err({Self}::from(LockError))`",
    label = "`{Self}` does not implement `From<lock_runtime::LockError>`",
    note = "add `impl From<lock_runtime::LockError> for {Self}` (e.g. a variant that keeps the \
            `LockError`), or return an error type that has it: `lock_runtime::LockError`, \
            `std::io::Error`, `anyhow::Error`"
)]
pub trait FromLockError {
    /// `Self::from(error)`.
    fn from_lock_error(error: LockError) -> Self;
}

impl<E: From<LockError>> FromLockError for E {
    fn from_lock_error(error: LockError) -> Self {
        E::from(error)
    }
}

/// What `client = <expr>` may name: the [`Client`] to lock with.
///
/// Implemented for everything that is `AsRef<Client>`: a [`Client`],
/// `&Client`, `Arc<Client>`, `Box<Client>`, or a type of yours with an
/// `impl AsRef<Client>` (to write `client = state` directly). The expansion
/// borrows the expression and clones the client (the clone shares the
/// connection), so the body can still use what it names (`app` after
/// `client = app.locks`).
#[diagnostic::on_unimplemented(
    message = "`client = ...` takes a `lock_runtime::Client`, and this expression is a `{Self}`",
    label = "a `{Self}`, not a `lock_runtime::Client`",
    note = "write an expression for a `Client`, `&Client` or `Arc<Client>`, e.g. `client = \
            app.locks`; to lock on the Redis at a URL, build `Client::new(Config::new(url))` once \
            at start-up and keep it where the function can reach it"
)]
pub trait LockClient {
    /// The client to lock with (a clone: it shares the connection).
    fn lock_client(&self) -> Client;
}

// Not recommended: an error names `LockClient` (whose message says what to
// write), not `AsRef<Client>` and every `AsRef` the type has.
#[diagnostic::do_not_recommend]
impl<C: AsRef<Client> + ?Sized> LockClient for C {
    fn lock_client(&self) -> Client {
        self.as_ref().clone()
    }
}

/// Lets `client =` name a `Client` itself (and `&Client`, through the
/// blanket impl of `AsRef` for references).
impl AsRef<Client> for Client {
    fn as_ref(&self) -> &Client {
        self
    }
}

/// `()` and `Option` cannot carry the error, so it is recorded: a busy lock at
/// info level (another instance is doing the work: normal), anything else at
/// error level, except a renewed lock lost mid-body: that loss was already
/// logged once, at warn, inside the `lock.hold` span (with its cause).
fn log_skip(error: &LockError, function: &'static str) {
    if error.is_busy() {
        tracing::info!(function, %error, "lock busy; body skipped");
    } else if matches!(error, LockError::Lost { cause, .. } if *cause != LostCause::Released) {
        tracing::debug!(function, %error, "lock lost; body stopped");
    } else if error.is_lost() {
        tracing::error!(function, %error, "lock lost; body stopped");
    } else {
        tracing::error!(function, %error, "lock not acquired; body skipped");
    }
}

/// Runs `body` under `lock`, or returns `not_acquired`'s value. What the
/// attribute's expansion calls; not a public API.
///
/// `function` is the annotated function's path (the holder record's
/// function), `template` the attribute's key as written (`order:<id>`: the
/// `lock` label of its metrics, one series whatever the ids). `not_acquired`
/// is `<R as NotAcquired>::not_acquired`, named by the expansion at the
/// return type: the return type is checked there, once, and an error names
/// the user's types.
#[doc(hidden)]
pub async fn run<R>(
    lock: Lock,
    function: &'static str,
    template: &'static str,
    body: impl Future<Output = R>,
    not_acquired: fn(LockError, &'static str) -> R,
) -> R {
    let lock = lock.caller(function).metric_label(template);
    match lock.run(body).await {
        Ok(output) => output,
        Err(error) => not_acquired(error, function),
    }
}

/// [`run`] for `key = ["a:<x>", "b:<y>"]`: `body` under every lock of the
/// set (`template`: the templates as written, joined). Not a public API.
#[doc(hidden)]
pub async fn run_all<R>(
    set: MultiLock,
    function: &'static str,
    template: &'static str,
    body: impl Future<Output = R>,
    not_acquired: fn(LockError, &'static str) -> R,
) -> R {
    let set = set.caller(function).metric_label(template);
    match set.run(body).await {
        Ok(output) => output,
        Err(error) => not_acquired(error, function),
    }
}
