//! The `#[distributed_lock]` attribute. Use it through `lock_runtime`, which
//! re-exports it: `use lock_runtime::distributed_lock;`.
//!
//! The attribute is a thin syntax layer: it checks its arguments and the
//! function's signature, then hands the body, unchanged, to
//! `lock_runtime::__private::run`. Everything that runs lives in `lock_runtime`.

mod args;
mod duration;
mod expand;
mod key_template;
mod return_kind;

use proc_macro::TokenStream;

/// Runs the body of an `async fn` under a Redis distributed lock.
///
/// ```ignore
/// #[distributed_lock(key = "lottery:<date>", ttl = "10s", wait = "2s")]
/// async fn draw_lottery(date: NaiveDate) -> Result<Vec<UserId>, JobError> { ... }
/// ```
///
/// - `key` (required): the lock's name; `<name>` and `<name.field>` are
///   replaced by the `Display` of a parameter, or of a name a parameter's
///   pattern binds (`id` in `Path(id): Path<u64>`, `a` in `(a, b): (u8, u8)`,
///   `order_id` in `Order { id: order_id, .. }: Order`).
/// - `ttl` (default 30 s, at most a year, `"8760h"`): how long the lock lives
///   if never released; with `renew`, at least `"10ms"`.
/// - `wait` (default: none): how long to wait for a busy lock; without it a
///   busy lock is not waited for.
/// - `renew` (flag): keep the lock for as long as the body runs; the body is
///   stopped if the lock is lost.
/// - `max_hold` (with `renew`, at most a year): stop renewing after this long.
/// - `on_lost = "stop" | "continue"` (with `renew`, default `"stop"`).
/// - `fair` (flag): waiters get the lock in arrival order.
/// - `fencing` (flag): issue a fencing token with each acquisition,
///   `current().unwrap().fencing_token()` in the body.
/// - `hold_at_least` (default: none, at most a year): keep the lock at least
///   this long after acquiring it, even if the body ends sooner.
/// - `read` / `write` (flags): take the read side (shared with other
///   readers) or the write side (alone) of a `lock_runtime::RwLock` of this
///   key instead of an exclusive lock. Not both; `hold_at_least` only with
///   `write`. A `read` fn called inside a `write` fn on the same key enters
///   at once; a `write` inside a `read` fails with `LockError::Config`.
/// - `permits = N` (an integer literal, 1 to `u32::MAX`): take one permit of
///   a `lock_runtime::Semaphore` of N permits: at most N bodies run at once.
///   Not with `read` or `write`; no `fencing` or `hold_at_least` (a
///   semaphore has several holders at once).
/// - `client = <expr>` (default: the process-wide client): an expression, not
///   a string, for the `lock_runtime::Client` to use: a `Client`, `&Client`,
///   `Arc<Client>` (anything `AsRef<Client>`). Evaluated in the function's
///   scope before the body, borrowed and cloned: the body can still use what
///   it names (`client = app.locks`, `client = self.locks`,
///   `client = &state.client`).
/// - `crate = "path"` (default `"::lock_runtime"`): where `lock_runtime` is
///   reachable, for a crate that re-exports it (`crate = "my_service::locks"`).
///
/// An axum-style handler, its extractors destructured, locking with the
/// application's client:
///
/// ```ignore
/// #[distributed_lock(key = "order:<id>", wait = "2s", client = app.locks)]
/// async fn settle(
///     State(app): State<App>,
///     Path(id): Path<u64>,
/// ) -> Result<Json<Receipt>, ApiError> {
///     Ok(Json(app.payments.settle(id).await?))
/// }
/// ```
///
/// Through a re-export (`pub use lock_runtime as locks;` in `my_service`):
///
/// ```ignore
/// #[my_service::locks::distributed_lock(key = "report:<day>", crate = "my_service::locks")]
/// async fn build_report(day: u32) { ... }
/// ```
///
/// When the lock is not acquired, the body does not run and the function
/// returns `Err(E::from(LockError))` for `Result<T, E>`, `None` for
/// `Option<T>`, and nothing for `()` (the reason is logged with `tracing`).
/// See the `lock_runtime` crate for the full documentation.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
