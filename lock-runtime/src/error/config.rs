//! What can be wrong with a configuration: one variant per cause.

use std::time::Duration;

/// Why a client, a lock or an entry into one was refused before any Redis
/// call: a [`LockError::Config`](crate::LockError::Config).
///
/// Each message says what is wrong and how to fix it. URLs are shown with
/// the password masked. Variants that concern one lock carry its `name`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No Redis URL: neither [`init`](crate::init) nor `REDIS_URL`.
    #[error(
        "no Redis URL configured: call `lock_runtime::init(\"redis://host:6379\")` at start-up \
         or set the REDIS_URL environment variable"
    )]
    NoUrl,

    /// A URL that cannot be parsed, or a client the `redis` crate cannot
    /// set up from it.
    #[error("`{url}` is not a usable Redis URL ({reason}); expected {expected}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What the parser said.
        reason: String,
        /// The forms that are accepted.
        expected: &'static str,
    },

    /// A `rediss://` URL in a build without TLS support.
    #[error(
        "`{url}` asks for TLS (`rediss://`), but this build of lock-runtime has no TLS support: \
         enable lock-runtime's `tls-rustls` feature (lock-runtime = {{ version = \"...\", \
         features = [\"tls-rustls\"] }}), or use `redis://` for a Redis without TLS"
    )]
    TlsNotBuiltIn {
        /// The URL, password masked.
        url: String,
    },

    /// TLS settings that cannot work: certificates that are not PEM or a
    /// key that does not match its certificate, certificates with a URL
    /// without TLS, `#insecure`, certificates in a build without TLS.
    #[error("TLS configuration: {reason}")]
    InvalidTls {
        /// What is wrong and how to fix it (never quoting a key).
        reason: String,
    },

    /// A client option out of range or in conflict with another.
    #[error("client option `{option}`: {reason}")]
    InvalidClientOption {
        /// The [`Config`](crate::Config) option: `connect_timeout`,
        /// `key_prefix`, `quorum`, `acknowledged`, ...
        option: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A lock name Redis keys cannot be made from.
    #[error("lock name `{name}`: {reason}")]
    InvalidName {
        /// The name (its first 32 characters when it is too long).
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A lock option out of range, or one that does not apply to this
    /// kind of lock.
    #[error("lock `{name}`, option `{option}`: {reason}")]
    InvalidLockOption {
        /// The lock's name.
        name: String,
        /// The option: `ttl`, `wait`, `renew`, `max_hold`, `hold_at_least`,
        /// `permits`, ...
        option: &'static str,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A lock's ttl out of range (1 ms to a year, at least
    /// [`MIN_RENEWED_TTL`](crate::MIN_RENEWED_TTL) when renewed, at least
    /// 10 ms over a quorum).
    #[error("lock `{name}` has a ttl of {}; {reason}", super::Readable(*ttl))]
    InvalidTtl {
        /// The lock's name.
        name: String,
        /// The ttl asked for.
        ttl: Duration,
        /// The range, and why.
        reason: &'static str,
    },

    /// A semaphore opened with another number of permits than its holders
    /// use.
    #[error(
        "semaphore `{name}` is held with {held} permits, but this call opens it with {asked}: \
         every user of a semaphore must give the same number of permits (it can change once \
         nobody holds it)"
    )]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The number of permits its holders opened it with.
        held: u64,
        /// The number this call gave.
        asked: u64,
    },

    /// An entry into a lock this task already holds (up its call chain)
    /// that cannot share the outer hold: a write inside a read, `fencing`
    /// asked for inside a hold taken without it, an entry beside a guard.
    #[error("lock `{name}` is already held up this task's call chain: {reason}")]
    Reentry {
        /// The lock's name.
        name: String,
        /// Why this entry cannot share the hold, and what to do.
        reason: &'static str,
    },

    /// A kind of lock or option this client's backend does not offer.
    #[error("lock `{name}`: {reason}")]
    Unsupported {
        /// The lock's name.
        name: String,
        /// What is not offered, and what to use instead.
        reason: &'static str,
    },

    /// Called outside a Tokio runtime.
    #[error(
        "no Tokio runtime: locks and clients must be used inside one (`#[tokio::main]`, or a \
         `tokio::runtime::Runtime`)"
    )]
    NoRuntime,

    /// The runtime shut down while a lock was being handed on.
    #[error(
        "lock `{name}`: its hand-off task was cancelled (the Tokio runtime is shutting down); \
         the lock frees itself when its ttl passes"
    )]
    RuntimeShutDown {
        /// The lock's name.
        name: String,
    },

    /// [`init`](crate::init) called after the process-wide client was made,
    /// or twice.
    #[error("lock_runtime::init {reason}; call it once, at start-up, before the first lock")]
    LateInit {
        /// What happened (with the URL of the second call, password masked).
        reason: String,
    },

    /// The operating system's random source failed: no token can be made.
    #[error("the operating system's random source failed ({reason}); no lock token can be made")]
    NoRandomSource {
        /// The error from the random source.
        reason: String,
    },
}
