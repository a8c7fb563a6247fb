//! What `#[distributed_lock]` expands to calls: `run`, the trait that turns
//! "not acquired" into the annotated function's return type, and
//! `lock_client` for `client = <expr>`. Not a public API; only the macro's
//! expansion uses it.

use std::future::Future;

use crate::client::Client;
use crate::error::{LockError, LostCause};
use crate::fronts::lock::Lock;

/// The client named by `client = <expr>`: the expansion passes `&(expr)`, so
/// the expression's owner is only borrowed (the body can still use `app` after
/// `client = app.locks`). Takes a `Client`, `&Client`, `Arc<Client>`,
/// `Box<Client>`, or anything else that is `AsRef<Client>`; the clone shares
/// the connection.
pub fn lock_client<C: AsRef<Client> + ?Sized>(client: &C) -> Client {
    client.as_ref().clone()
}

/// Lets `lock_client` take a `Client` itself, and `&Client` through the
/// blanket impl for references.
impl AsRef<Client> for Client {
    fn as_ref(&self) -> &Client {
        self
    }
}

/// How a return type says "the lock was not acquired, the body did not run"
/// (or, for a renewed lock, "the lock was lost, the body was stopped").
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot report a lock that was not acquired through `{Self}`",
    label = "this return type has no way to say the body did not run",
    note = "return `Result<T, E>` with `E: From<lock_runtime::LockError>`, `Option<T>` or `()`"
)]
pub trait NotAcquired {
    /// The value returned instead of running the body.
    fn not_acquired(error: LockError, function: &'static str) -> Self;
}

impl<T, E: From<LockError>> NotAcquired for Result<T, E> {
    fn not_acquired(error: LockError, function: &'static str) -> Self {
        tracing::debug!(function, %error, "lock not acquired; body skipped");
        Err(E::from(error))
    }
}

impl<T> NotAcquired for Option<T> {
    fn not_acquired(error: LockError, function: &'static str) -> Self {
        log_skip(&error, function);
        None
    }
}

impl NotAcquired for () {
    fn not_acquired(error: LockError, function: &'static str) {
        log_skip(&error, function);
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

/// Runs `body` under `lock`, or returns the not-acquired value of `R`.
/// `function` is the annotated function's path (the holder record's
/// function), `template` the attribute's key as written (`order:<id>`: the
/// `lock` label of its metrics, one series whatever the ids).
pub async fn run<R: NotAcquired>(
    lock: Lock,
    function: &'static str,
    template: &'static str,
    body: impl Future<Output = R>,
) -> R {
    let lock = lock.caller(function).metric_label(template);
    match lock.run(body).await {
        Ok(output) => output,
        Err(error) => R::not_acquired(error, function),
    }
}
