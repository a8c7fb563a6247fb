//! The `#[distributed_lock]` attribute. Use it through `lock_runtime`, which
//! re-exports it: `use lock_runtime::distributed_lock;`.
//!
//! The attribute is a thin syntax layer: it checks its arguments and the
//! function's signature, then hands the body, unchanged, to
//! `lock_runtime::__private::run`. Everything that runs lives in `lock_runtime`.

#![warn(missing_docs, unreachable_pub)]

mod args;
mod boxed_future;
mod duration;
mod expand;
mod key_template;
mod return_kind;
mod suggest;

use proc_macro::TokenStream;

/// Runs the body of an `async fn` under a Redis distributed lock.
///
/// Use it through `lock_runtime` (`use lock_runtime::distributed_lock;`). It goes on an
/// `async fn`: a free function, or a method taking `&self`, `&mut self` or `self` (in an `impl`,
/// a trait impl, or an `#[async_trait]` impl such as a tonic service's, where it holds the lock
/// around the future async-trait made of the `async fn`). The body is kept as written and handed to one runtime function,
/// `lock_runtime::__private::run`, which takes the lock, runs the body, and releases it.
///
/// When the lock is not acquired, the body does not run and the function returns
/// `Err(E::from(LockError))` for `Result<T, E>` (any path ending in `Result`), `None` for
/// `Option<T>`, and nothing for `()` (the reason is logged with `tracing`).
///
/// # Arguments
///
/// Every argument is checked at compile time: a misspelt name (with "did you mean"), a
/// malformed duration, an unknown placeholder or two arguments that cannot go together is a
/// compile error pointing at it. A return type or a `client =` expression the runtime cannot
/// use is an error naming the type and saying what to write (the traits it names are in
/// `lock_runtime::attribute`).
///
/// **`key = "..."`** (required): the lock's name. `<name>` is replaced by the `Display` of a
/// parameter, of a name a parameter's pattern binds, or of a field path under one
/// (`<order.id>`, `<self.shard>`, `<pair.0>`). Braces are literal text, as in a Redis Cluster
/// hash tag (`"{tenant}:job"`, `"{<region>}:orders"`), so `{id}` written as in `format!`, where
/// `id` is a parameter, is a compile error that says to write `<id>`:
///
/// ```rust,no_run
/// use lock_runtime::{distributed_lock, LockError};
///
/// struct Order { id: u64, shop: u32 }
///
/// #[distributed_lock(key = "order:<order.shop>:<order.id>")]
/// async fn settle(order: Order) -> Result<(), LockError> { Ok(()) }
///
/// #[distributed_lock(key = "pair:<a>-<b>")]
/// async fn swap((a, b): (u32, u32)) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`key = ["...", "..."]`**: several locks at once, every one or none, without deadlock
/// (`lock_runtime::Lock::all`); each template as above, the same name twice is one lock:
///
/// ```rust,no_run
/// use lock_runtime::{distributed_lock, LockError};
///
/// #[distributed_lock(key = ["account:<from>", "account:<to>"], wait = "2s")]
/// async fn transfer(from: u64, to: u64, cents: i64) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`ttl = "10s"`** (default 30 s; from 1 ms to a year, `"8760h"`; at least `"10ms"` with
/// `renew`): how long the lock lives if its holder never releases it. Units `ms`, `s`, `m`, `h`,
/// combinable (`"1m30s"`):
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "lottery:<date>", ttl = "10s")]
/// async fn draw(date: &str) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`wait = "2s"`** (default: none): how long to wait for a busy lock (woken by the release,
/// not by polling). Without it a busy lock gives `LockError::Busy` at once:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "order:<id>", wait = "2s")]
/// async fn pay(id: u64) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`renew`** (flag): keep the lock for as long as the body runs (renewed every ttl/3); the
/// body is stopped if the lock is lost. **`max_hold = "10m"`** (with `renew`, at most a year)
/// stops renewing after that long; **`on_lost = "stop" | "continue"`** (with `renew`, default
/// `"stop"`) says what a lost lock does to the body:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "report:<day>", ttl = "10s", renew, max_hold = "10m", on_lost = "stop")]
/// async fn report(day: u32) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`fair`** (flag): waiters get the lock strictly in arrival order:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "queue:<name>", wait = "5s", fair)]
/// async fn next(name: &str) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`fencing`** (flag): a fencing token with each acquisition, strictly larger than every
/// earlier one for the key, read in the body:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "invoice:<id>", fencing)]
/// async fn bill(id: u64) -> Result<u64, LockError> {
///     Ok(lock_runtime::current().unwrap().fencing_token().unwrap())
/// }
/// ```
///
/// **`hold_at_least = "60s"`** (default: none, at most a year): keep the lock at least this long
/// after acquiring it, even if the body ends sooner (a fast scheduled job does not run twice):
///
/// ```rust,no_run
/// # use lock_runtime::distributed_lock;
/// #[distributed_lock(key = "noon-job", ttl = "2m", hold_at_least = "60s")]
/// async fn noon_job() {}
/// ```
///
/// **`read`** / **`write`** (flags): the read side (shared with other readers) or the write
/// side (alone) of a `lock_runtime::RwLock` of this key. Not both; `hold_at_least` only with
/// `write`. A `read` fn called inside a `write` fn on the same key enters at once; a `write`
/// inside a `read` fails with `LockError::Config`:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "prices:<shop>", wait = "2s", read)]
/// async fn quote(shop: u64) -> Result<u64, LockError> { Ok(1) }
///
/// #[distributed_lock(key = "prices:<shop>", wait = "10s", write)]
/// async fn reprice(shop: u64) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`permits = N`** (an integer literal, 1 to `u32::MAX`): one permit of a
/// `lock_runtime::Semaphore` of N permits: at most N bodies run at once. Not with `read` or
/// `write`; no `fencing` or `hold_at_least`:
///
/// ```rust,no_run
/// # use lock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "exports", permits = 4, wait = "1m")]
/// async fn export(report: u64) -> Result<(), LockError> { Ok(()) }
/// ```
///
/// **`client = <expr>`** (default: the process-wide client): an expression, not a string, for
/// the `lock_runtime::Client` to use (`Client`, `&Client`, `Arc<Client>`: anything
/// `AsRef<Client>`), evaluated in the function's scope before the body, borrowed and cloned, so
/// the body can still use what it names. An axum-style handler, its extractors destructured:
///
/// ```rust,no_run
/// use axum::extract::{Path, State};
/// use lock_runtime::{distributed_lock, Client, LockError};
///
/// #[derive(Clone)]
/// struct App { locks: Client }
///
/// #[distributed_lock(key = "order:<id>", wait = "2s", client = app.locks)]
/// async fn settle(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
///     Ok(format!("order {id} settled"))
/// }
///
/// struct Shard { locks: Client, shard: u32 }
///
/// impl Shard {
///     #[distributed_lock(key = "shard:<self.shard>", client = self.locks)]
///     async fn compact(&self) -> Result<(), LockError> { Ok(()) }
/// }
/// ```
///
/// **`crate = "path"`** (default `"::lock_runtime"`): where `lock_runtime` is reachable, for a
/// crate that re-exports it (`pub use lock_runtime as locks;` in `my_service`, then
/// `#[my_service::locks::distributed_lock(key = "...", crate = "my_service::locks")]`).
///
/// See the `lock_runtime` crate for the whole documentation.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
