// The README is the crate's front page: its examples compile as doctests.
// `lock-runtime/README.md` is a link to the repository's README.md, so that
// the package carries it (scripts/check-package.sh builds from the package).
// Its links to the guide are references, defined at its end for the
// repository and first here, in `guide/links.md`, for rustdoc (the first
// definition of a label wins).
#![doc = include_str!("guide/links.md")]
#![doc = include_str!("../README.md")]
#![warn(missing_docs, unreachable_pub, rustdoc::broken_intra_doc_links)]

// Layers, each using only those below it (docs/design.md §10, checked by
// tests/import_cycles.rs): the public fronts (`fronts`: `Lock`, its guard),
// the client, the lease machinery every lock kind shares (`lease`), the
// backend (`backend`: every Redis call and its replies), the transport
// (`transport`: every connection, TCP or simulated), and the foundations
// (`error`, `keys`, `tls`, `token`, `wall_clock`, ...). `admin` (inspection,
// force release: lockctl) sits beside the fronts.
/// Awaits `$future` inside `$span` (entered at every poll), or bare when
/// no subscriber wants the span: the wrapper (`Instrumented`) would move
/// the whole future once more, on every acquire and release.
macro_rules! in_span {
    ($span:expr, $future:expr) => {
        if $span.is_disabled() {
            $future.await
        } else {
            tracing::Instrument::instrument($future, $span.clone()).await
        }
    };
}

mod backend;
mod client;
// After `client`: rustdoc lists `Client`'s own methods (`new`, ...) before
// the admin ones (`inspect`, `force_release`).
pub mod admin;
mod error;
mod fronts;
mod keys;
mod lease;
mod observe;
mod redact;
mod signal;
mod tls;
mod token;
mod transport;
mod url;
mod wall_clock;

pub mod attribute;
pub mod guide;

/// Deterministic simulation (feature `simulation`; not a public API, for
/// the project's simulation harness): the network a harness implements
/// ([`Network`](simulation::Network), [`Conn`](simulation::Conn)), given to
/// `Config::network`. docs/design.md §10.
#[cfg(feature = "simulation")]
#[doc(hidden)]
pub mod simulation {
    pub use crate::signal::{Changes, Closed};
    pub use crate::transport::simulated::{Conn, Network, Push};
    pub use futures_util::future::BoxFuture;
}

/// What `#[distributed_lock]` expands to calls. Not a public API: only the
/// attribute's expansion uses it.
#[doc(hidden)]
pub mod __private {
    pub use crate::attribute::{run, run_all, LockClient, NotAcquired};
}

pub use client::{global_client, init, init_with, Client, Config, REDIS_URL_ENV};
pub use error::{ConfigError, LockError, LostCause};
pub use fronts::holder::LockHolder;
pub use fronts::lock::{Lock, MIN_RENEWED_TTL};
pub use fronts::multi_lock::{MultiGuard, MultiLock};
pub use fronts::rw_lock::RwLock;
pub use fronts::semaphore::Semaphore;
pub use keys::MAX_KEY_LEN;
pub use lease::guard::{LockGuard, OnLost};
pub use lease::renewal::RenewalStats;
pub use lease::watch::{current, HeldLock};
pub use lock_macros::distributed_lock;
#[cfg(feature = "metrics")]
pub use observe::describe_metrics;
pub use observe::{set_metric_prefix, DEFAULT_METRIC_PREFIX};
/// The `redis` crate this one is built on, re-exported so that
/// [`LockError::Redis`]'s `source` (a [`redis::RedisError`]) can be named
/// without a `redis` dependency of your own, at the same version.
pub use redis;
