//! The one error type of the crate, its configuration causes, and what a
//! Redis error means (`causes`).

mod causes;
mod config;
mod readable;

use std::time::Duration;

pub(crate) use causes::{
    is_no_primary, is_refusal, is_script_error, is_unknown_master, retryable, NoPrimary,
};
pub use config::ConfigError;
pub(crate) use readable::Readable;

/// Why a held lock is no longer held by its holder.
///
/// A key found gone or holding another token is told apart by the holder's
/// local validity (its monotonic deadline): when the validity had run out the
/// ttl did its work ([`Expired`](LostCause::Expired),
/// [`TakenOver`](LostCause::TakenOver)); while it still had time something
/// removed the key ([`Deleted`](LostCause::Deleted),
/// [`Replaced`](LostCause::Replaced)). Each cause's `Display` ends with
/// advice that fits it.
///
/// ```no_run
/// # async fn build_report() {}
/// # async fn demo() {
/// use std::time::Duration;
/// use lock_runtime::{Lock, LockError, LostCause};
///
/// let report = Lock::new("report").ttl(Duration::from_secs(10)).renew();
/// match report.run(build_report()).await {
///     Err(LockError::Lost { cause: LostCause::MaxHold, .. }) => {
///         eprintln!("the report ran past max_hold and was stopped");
///     }
///     Err(LockError::Lost { cause, .. }) => eprintln!("stopped: the lock was lost ({cause})"),
///     Err(error) => eprintln!("not run: {error}"),
///     Ok(()) => {}
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostCause {
    /// The key was gone after the holder's validity had run out: the ttl
    /// passed before the release (or a renewal came too late).
    Expired,
    /// Another holder's token was in the key after the holder's validity had
    /// run out: the ttl passed and another holder acquired the lock.
    TakenOver,
    /// The validity deadline passed before a renewal was confirmed: Redis was
    /// unreachable or slow, or this process was paused (GC, SIGSTOP, an
    /// overloaded host) for longer than the time left.
    NotRenewed,
    /// `max_hold` was reached: renewals stopped and the ttl ran out.
    MaxHold,
    /// The outermost holder released it (seen by a reentrant guard or a
    /// `current()` handle that outlived the hold).
    Released,
    /// The key was gone while the holder's validity still had time: it was
    /// deleted (a forced release such as `lockctl release --force`,
    /// `FLUSHALL`/`FLUSHDB`, eviction under `maxmemory`, a restart without
    /// persistence, a failover to a replica that never had it), not expired.
    Deleted,
    /// Another token was in the key while the holder's validity still had
    /// time: the key was deleted or overwritten and another holder took it
    /// (a forced release, a failover to a replica that never had the lock).
    Replaced,
    /// Redis refused the renewal because the Redis user lacks a permission
    /// (ACL): the lock could not be kept. The logged warning names the
    /// command and the rule to add.
    PermissionDenied,
    /// Redis refused the renewal with an error other than a permission (a
    /// script error): the lock could not be kept. The logged warning quotes
    /// it.
    Refused,
}

impl LostCause {
    pub(crate) fn code(self) -> u8 {
        match self {
            LostCause::Expired => 1,
            LostCause::TakenOver => 2,
            LostCause::NotRenewed => 3,
            LostCause::MaxHold => 4,
            LostCause::Released => 5,
            LostCause::Deleted => 6,
            LostCause::Replaced => 7,
            LostCause::PermissionDenied => 8,
            LostCause::Refused => 9,
        }
    }

    /// The `cause` label of the `distributed_lock_lost_total` metric.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            LostCause::Expired => "expired",
            LostCause::TakenOver => "taken_over",
            LostCause::NotRenewed => "not_renewed",
            LostCause::MaxHold => "max_hold",
            LostCause::Released => "released",
            LostCause::Deleted => "deleted",
            LostCause::Replaced => "replaced",
            LostCause::PermissionDenied => "permission_denied",
            LostCause::Refused => "refused",
        }
    }

    pub(crate) fn from_code(code: u8) -> LostCause {
        match code {
            1 => LostCause::Expired,
            2 => LostCause::TakenOver,
            3 => LostCause::NotRenewed,
            4 => LostCause::MaxHold,
            6 => LostCause::Deleted,
            7 => LostCause::Replaced,
            8 => LostCause::PermissionDenied,
            9 => LostCause::Refused,
            _ => LostCause::Released,
        }
    }

    /// What the holder can do about this cause.
    fn advice(self) -> &'static str {
        match self {
            LostCause::Expired | LostCause::TakenOver => {
                "use a longer ttl, or `renew` for work that can outlast it"
            }
            LostCause::NotRenewed => {
                "check Redis's health and latency and this process's pauses; a longer ttl gives \
                 renewals more time to get through"
            }
            LostCause::MaxHold => "give a larger `max_hold` if the work may take longer",
            LostCause::Released => {
                "do not use a reentrant entry or `current()` handle after \
                 the outermost holder released the lock"
            }
            LostCause::Deleted | LostCause::Replaced => {
                "a longer ttl does not help: find what removes lock keys (a forced release, \
                 FLUSHALL/FLUSHDB, eviction: give Redis a `noeviction` or `volatile-*` policy \
                 with room, a restart without persistence, a failover: see acknowledged mode)"
            }
            LostCause::PermissionDenied => {
                "grant the Redis user the permission the logged warning names (the minimal ACL \
                 rule in lock_runtime's guide, Configuration)"
            }
            LostCause::Refused => "see the logged warning for Redis's error",
        }
    }
}

impl std::fmt::Display for LostCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostCause::Expired => "its key expired before the holder released it",
            LostCause::TakenOver => "its ttl passed and another holder acquired it",
            LostCause::NotRenewed => {
                "its validity ran out before a renewal was confirmed (Redis unreachable or slow, \
                 or this process was paused)"
            }
            LostCause::MaxHold => "`max_hold` was reached, so renewals stopped and its ttl ran out",
            LostCause::Released => "its outermost holder released it",
            LostCause::Deleted => {
                "its key was deleted while the holder's validity still had time (its ttl had not run \
                 out)"
            }
            LostCause::Replaced => {
                "its key was replaced by another holder's while the holder's validity still had \
                 time (its ttl had not run out)"
            }
            LostCause::PermissionDenied => {
                "Redis refused its renewal: the Redis user lacks a permission"
            }
            LostCause::Refused => "Redis refused its renewal with an error",
        })
    }
}

/// Everything that can go wrong when taking, holding or releasing a lock.
///
/// Each message says what happened and what to do about it. No variant ever
/// carries a password: Redis URLs are shown with the password masked.
///
/// ```no_run
/// use lock_runtime::redis::RedisError; // the `redis` crate, re-exported
/// use lock_runtime::{Lock, LockError};
///
/// async fn settle(id: u64) -> &'static str {
///     match Lock::new(format!("order:{id}")).run(async { /* settle it */ }).await {
///         Ok(()) => "settled",
///         // `Busy` or `WaitTimeout`: another instance is settling it.
///         Err(error) if error.is_busy() => "being settled elsewhere",
///         Err(LockError::Lost { cause, .. }) => {
///             eprintln!("order {id}: lock lost ({cause}); check the order");
///             "check"
///         }
///         Err(LockError::Redis { source, .. }) => {
///             let source: RedisError = source;
///             eprintln!("order {id}: Redis: {source}");
///             "retry later"
///         }
///         // Configuration errors, and variants added later.
///         Err(error) => {
///             eprintln!("order {id}: {error}");
///             "failed"
///         }
///     }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock is held by another holder and no waiting was asked for.
    #[error(
        "lock `{name}` is held by another holder; not acquired (set `wait` to wait for it \
         instead of giving up at once)"
    )]
    Busy {
        /// The lock's name, as the caller wrote it.
        name: String,
    },

    /// The lock is not held, but kept by `hold_at_least` after its last
    /// holder's release (a scheduled job that ran already): nobody may take
    /// it before the kept time is over. [`is_busy`](LockError::is_busy).
    #[error(
        "lock `{name}` is kept for {} more by `hold_at_least` after its last holder released \
         it (the job ran already); not acquired: it is free again after that",
        Readable(*remaining)
    )]
    Kept {
        /// The lock's name, as the caller wrote it.
        name: String,
        /// How long it is kept still, when it was read.
        remaining: Duration,
    },

    /// The lock stayed busy for the whole `wait`.
    #[error(
        "lock `{name}` stayed held by another holder for the whole wait of {}; not \
         acquired (wait longer, or make the holder's critical section shorter)",
        Readable(*waited)
    )]
    WaitTimeout {
        /// The lock's name, as the caller wrote it.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The holder no longer holds the lock: another holder may have run its
    /// critical section at the same time.
    #[error(
        "lock `{name}` was lost: {cause}; another holder may have run at the same time ({})",
        cause.advice()
    )]
    Lost {
        /// The lock's name, as the caller wrote it.
        name: String,
        /// What Redis showed.
        cause: LostCause,
    },

    /// Acknowledged mode: the primary took the lock, but fewer replicas than
    /// asked confirmed the write in time. The lock was given back. The
    /// message says why when the primary said (`connected`): fewer replicas
    /// connected than asked for (no acquisition can be granted until more
    /// connect: after a failover the promoted replica often has none), or
    /// replicas connected but too slow.
    #[error("{}", not_replicated(name, *confirmed, *wanted, *timeout, *connected))]
    NotReplicated {
        /// The lock's name, as the caller wrote it.
        name: String,
        /// How many replicas confirmed (`None`: unknown, after a retried call).
        confirmed: Option<u32>,
        /// How many were asked for.
        wanted: u32,
        /// How long they were given.
        timeout: Duration,
        /// How many replicas the primary had connected when the write was
        /// refused (its `ROLE`), if it said.
        connected: Option<u32>,
    },

    /// Redis could not be reached or answered with an error.
    #[error(
        "Redis {operation} for lock `{name}`{} failed: {source} ({})",
        at(server),
        advice(source)
    )]
    Redis {
        /// The lock's name, as the caller wrote it.
        name: String,
        /// What was being done: `acquire`, `release`, ...
        operation: &'static str,
        /// Where the call went, its password masked:
        /// `redis://app:***@10.0.0.5:6379/0`, `cluster [..]`, `sentinel
        /// mymaster of [..]`; empty when the error is not one server's.
        server: String,
        /// The error from the Redis client. Timeouts are I/O errors of kind `TimedOut`.
        #[source]
        source: redis::RedisError,
    },

    /// The client, the lock or this entry into it is configured wrongly:
    /// refused before any Redis call. The [`ConfigError`] says which cause.
    #[error("lock configuration error: {0}")]
    Config(ConfigError),
}

/// The message of [`LockError::NotReplicated`]: what was refused, why, and
/// what to do.
fn not_replicated(
    name: &str,
    confirmed: Option<u32>,
    wanted: u32,
    timeout: Duration,
    connected: Option<u32>,
) -> String {
    let confirmed =
        confirmed.map_or_else(|| "not all".to_owned(), |confirmed| confirmed.to_string());
    let timeout = Readable(timeout);
    let refused = format!(
        "lock `{name}` was not acquired: {confirmed} of the {wanted} replicas asked for \
         confirmed the write within {timeout}, so a failover could lose it; it was given back"
    );
    match connected {
        Some(connected) if connected < wanted => format!(
            "{refused}. The primary has {connected} connected replica{}, fewer than the {wanted} \
             acknowledged mode asks for: every acquisition is refused until {} more connect{} \
             (after a failover the promoted replica has none until another replica, or the old \
             primary restarted, follows it). Bring a replica back, or size the setup: \
             `acknowledged(n, ..)` needs n + 1 replicas to go on through the loss of one node",
            if connected == 1 { "" } else { "s" },
            wanted - connected,
            if wanted - connected == 1 { "s" } else { "" },
        ),
        Some(connected) => format!(
            "{refused}. The primary has {connected} connected replicas: they are behind or slow \
             (check their lag and health, or give a longer acknowledged timeout)"
        ),
        None => format!(
            "{refused} (check the replicas' health and lag, give a longer acknowledged timeout, \
             or ask for fewer replicas)"
        ),
    }
}

impl From<ConfigError> for LockError {
    fn from(error: ConfigError) -> Self {
        LockError::Config(error)
    }
}

impl LockError {
    /// The lock was not acquired because another holder has it (`Busy` or
    /// `WaitTimeout`): the normal "someone else is doing it" outcome.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            LockError::Busy { .. } | LockError::Kept { .. } | LockError::WaitTimeout { .. }
        )
    }

    /// The holder learnt that it had lost the lock.
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }

    pub(crate) fn redis(name: &str, operation: &'static str, source: redis::RedisError) -> Self {
        LockError::redis_at(name, operation, "", source)
    }

    /// [`LockError::redis`] of a call to `server` (its password masked).
    pub(crate) fn redis_at(
        name: &str,
        operation: &'static str,
        server: &str,
        source: redis::RedisError,
    ) -> Self {
        LockError::Redis {
            name: name.to_owned(),
            operation,
            server: server.to_owned(),
            source,
        }
    }
}

/// What to do about a Redis error: it follows the error's kind. Only an
/// error of the connection (or no answer) points at Redis being down.
/// ` at <server>`, or nothing.
fn at(server: &str) -> String {
    if server.is_empty() {
        String::new()
    } else {
        format!(" at {server}")
    }
}

fn advice(source: &redis::RedisError) -> &'static str {
    use redis::{ErrorKind, ServerErrorKind};
    if let Some(failure) = crate::tls::handshake_failure(source) {
        return failure.advice();
    }
    if is_unknown_master(source) {
        return "no sentinel monitors a master of this name: check the name in the URL's path \
                (or Config::sentinel's), which must be the one of the sentinels' `sentinel \
                monitor <name> ...` lines; this is a configuration mistake, not a failover, and \
                does not pass by itself";
    }
    if is_no_primary(source) {
        return "check that the sentinels named are up and reachable and monitor this master \
                name, and that its primary is up; during a failover (the primary down, a \
                replica not yet promoted) it passes by itself";
    }
    match source.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            "the Redis user lacks a permission: grant it, see the minimal ACL rule in \
             lock_runtime's guide, Configuration"
        }
        ErrorKind::AuthenticationFailed => "check the user name and password in the URL",
        _ if is_script_error(source) => {
            "a lock script failed inside Redis: check that the server is Redis 6.2 or later and \
             that every instance runs the same version of this crate"
        }
        ErrorKind::Server(ServerErrorKind::ReadOnly) => {
            "the server is a read-only replica: give the primary's URL (or the cluster's, or \
             redis-sentinel:// with the sentinels)"
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown,
        ) => "Redis is not ready yet (loading, or a cluster in transition): it usually passes",
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => {
            "check that Redis is up and reachable at the configured URL"
        }
        ErrorKind::InvalidClientConfig => "check the URL",
        _ => "Redis answered with an error: see its text",
    }
}

impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        use std::io::ErrorKind;
        let kind = match &error {
            LockError::Busy { .. } | LockError::Kept { .. } => ErrorKind::WouldBlock,
            LockError::WaitTimeout { .. } => ErrorKind::TimedOut,
            LockError::Lost { .. } | LockError::NotReplicated { .. } => ErrorKind::Other,
            LockError::Redis { source, .. } if source.is_timeout() => ErrorKind::TimedOut,
            LockError::Redis { source, .. } if source.is_connection_refusal() => {
                ErrorKind::ConnectionRefused
            }
            LockError::Redis { .. } => ErrorKind::Other,
            LockError::Config { .. } => ErrorKind::InvalidInput,
        };
        std::io::Error::new(kind, error)
    }
}
