//! A Redis distributed lock for async Rust.
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! #[distributed_lock(key = "lottery:<date>", ttl = "10s")]
//! async fn draw_lottery(date: String) -> Result<Vec<u64>, LockError> {
//!     // Runs in at most one process at a time for a given date; the other
//!     // callers get Err(LockError::Busy) without running it.
//!     Ok(vec![7, 42])
//! }
//! ```
//!
//! The attribute and the manual API ([`Lock`]) share one implementation: see
//! the README for every argument, and `docs/design.md` for the Redis layout,
//! the scripts and the failure cases they handle.

// Layers, each using only those below it: the public fronts (`fronts`:
// `Lock`, its guard), the client, the lease machinery every lock kind shares
// (`lease`), and the backend (`backend`: every Redis call and its replies).
// `admin` (inspection, force release: lockctl) sits beside the fronts.
pub mod admin;
mod backend;
mod client;
mod error;
mod fronts;
mod keys;
mod lease;
mod observe;
mod redact;
mod token;

#[doc(hidden)]
#[path = "attribute.rs"]
pub mod __private;

pub use client::{global_client, init, init_with, Client, Config, REDIS_URL_ENV};
pub use error::{LockError, LostCause};
pub use fronts::lock::{Lock, MIN_RENEWED_TTL};
pub use fronts::rw_lock::RwLock;
pub use fronts::semaphore::Semaphore;
pub use keys::MAX_KEY_LEN;
pub use lease::guard::{LockGuard, OnLost};
pub use lease::renewal::RenewalStats;
pub use lease::watch::{current, HeldLock};
pub use lock_macros::distributed_lock;
