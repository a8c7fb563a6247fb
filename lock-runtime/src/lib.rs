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

mod acquire;
mod client;
mod cohort;
mod connection;
mod error;
mod guard;
mod hold;
mod keys;
mod local_handoff;
mod lock;
mod notify;
mod redact;
mod release;
mod renewal;
mod scripts;
mod token;
mod watch;

#[doc(hidden)]
#[path = "attribute.rs"]
pub mod __private;

pub use client::{global_client, init, init_with, Client, Config, REDIS_URL_ENV};
pub use error::{LockError, LostCause};
pub use guard::{LockGuard, OnLost};
pub use keys::MAX_KEY_LEN;
pub use lock::{Lock, MIN_RENEWED_TTL};
pub use lock_macros::distributed_lock;
pub use renewal::RenewalStats;
pub use watch::{current, HeldLock};
