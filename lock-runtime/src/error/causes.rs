//! What a Redis error means for the call that got it: whether sending it
//! again can help, whether Redis refused the call for what it is, whether
//! Redis Sentinel gave no primary. Below every layer that makes calls (the
//! transport, the backend, the lease machinery) and the error's own advice.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

/// Whether a failed call may succeed if sent again: the connection broke
/// (the manager reconnects), or Redis asked to try again (loading after a
/// restart, a cluster in transition). Not bad credentials, nor a rejected
/// TLS certificate.
pub(crate) fn retryable(error: &RedisError) -> bool {
    if error.kind() == redis::ErrorKind::AuthenticationFailed {
        return false;
    }
    // A certificate rejected in the TLS handshake (the server's, or ours
    // by the server) stays rejected until the configuration changes.
    if crate::tls::handshake_failure(error).is_some_and(|failure| failure.is_permanent()) {
        return false;
    }
    // The cluster client retries nothing itself (see `Target::Cluster`):
    // redirections and topology changes are retried here, where a retry
    // is known to be one (an acquire then recognises its own token, a
    // release a key its earlier attempt deleted).
    matches!(
        error.retry_method(),
        RetryMethod::Reconnect
            | RetryMethod::RetryImmediately
            | RetryMethod::WaitAndRetry
            | RetryMethod::MovedRedirect
            | RetryMethod::AskRedirect
            | RetryMethod::RefreshSlotsAndRetry
            | RetryMethod::ReconnectFromInitialConnections
    )
}

/// Whether `error` was raised inside a lock script (a Lua error, or a
/// command of the script that Redis refused), rather than by the
/// connection or by Redis before the script ran.
pub(crate) fn is_script_error(error: &RedisError) -> bool {
    let text = error.to_string();
    text.contains("@user_script:") || text.contains("Error running script")
}

/// Whether `error` is Redis refusing a call for what it is (a permission,
/// a script error), which it answers the same way every time, rather than a
/// fault of the connection or a passing state.
pub(crate) fn is_refusal(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) || is_script_error(error)
}

/// No sentinel named a primary that answers as one: what each said.
#[derive(Debug)]
pub(crate) struct NoPrimary {
    /// The master name asked for.
    pub(crate) master: String,
    /// What each sentinel, and each primary it named, said.
    pub(crate) reports: Vec<String>,
    /// Every sentinel refused the login, or every primary named did: a
    /// configuration mistake, not retried.
    pub(crate) login_refused: bool,
    /// A majority of the sentinels answered that they monitor no master of
    /// this name and none named one: a misspelt name, not retried.
    pub(crate) unknown_master: bool,
}

/// What the error of a master name no sentinel monitors says first: a
/// misspelt name, not a failover (`is_unknown_master`).
const UNKNOWN_MASTER: &str = "Redis Sentinel: no sentinel monitors a master of this name";

impl fmt::Display for NoPrimary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Redis Sentinel gave no primary for `{}` that answers as one: {}",
            self.master,
            self.reports.join("; ")
        )
    }
}

impl Error for NoPrimary {}

impl From<NoPrimary> for RedisError {
    /// An I/O error (retried within the call's deadline, as a primary
    /// that cannot be reached is) that keeps the reports; an
    /// authentication failure (not retried) when every login was refused.
    fn from(error: NoPrimary) -> RedisError {
        if error.unknown_master {
            return RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                UNKNOWN_MASTER,
                error.to_string(),
            ));
        }
        if error.login_refused {
            return RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "Redis Sentinel: the login was refused",
                error.to_string(),
            ));
        }
        std::io::Error::new(std::io::ErrorKind::NotConnected, error).into()
    }
}

/// Whether `error` says that no sentinel monitors the master name (for its
/// advice: check the name).
pub(crate) fn is_unknown_master(error: &RedisError) -> bool {
    error.to_string().contains(UNKNOWN_MASTER)
}

/// Whether `error` is a [`NoPrimary`] (for its advice).
pub(crate) fn is_no_primary(error: &RedisError) -> bool {
    let mut next: Option<&(dyn Error + 'static)> = error.source();
    for _ in 0..4 {
        let Some(current) = next else {
            return false;
        };
        if current.is::<NoPrimary>() {
            return true;
        }
        next = if let Some(io) = current.downcast_ref::<std::io::Error>() {
            io.get_ref().map(|inner| inner as &(dyn Error + 'static))
        } else if let Some(shared) = current.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            Some(shared.as_ref() as &(dyn Error + 'static))
        } else {
            current.source()
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_no_primary_error_is_recognised_and_names_each_sentinel() {
        let error: RedisError = NoPrimary {
            master: "mymaster".to_owned(),
            reports: vec![
                "sentinel 10.0.0.1:26379 could not be asked (refused)".to_owned(),
                "sentinel 10.0.0.2:26379 did not answer within 2s".to_owned(),
            ],
            login_refused: false,
            unknown_master: false,
        }
        .into();
        assert!(is_no_primary(&error));
        let text = error.to_string();
        assert!(
            text.contains("10.0.0.1:26379") && text.contains("10.0.0.2:26379"),
            "{text}"
        );
        assert!(retryable(&error));
        let other: RedisError = std::io::Error::other("boom").into();
        assert!(!is_no_primary(&other));
    }

    #[test]
    fn a_refused_login_everywhere_is_not_retried() {
        let error: RedisError = NoPrimary {
            master: "mymaster".to_owned(),
            reports: vec!["sentinel 10.0.0.1:26379 refused the login (WRONGPASS)".to_owned()],
            login_refused: true,
            unknown_master: false,
        }
        .into();
        assert_eq!(error.kind(), redis::ErrorKind::AuthenticationFailed);
        assert!(error.to_string().contains("10.0.0.1:26379"), "{error}");
        assert!(!retryable(&error));
    }

    #[test]
    fn a_master_name_no_sentinel_monitors_is_not_retried() {
        let error: RedisError = NoPrimary {
            master: "mymastr".to_owned(),
            reports: vec![
                "sentinel 10.0.0.1:26379 does not monitor a master named `mymastr`".to_owned(),
            ],
            login_refused: false,
            unknown_master: true,
        }
        .into();
        assert!(is_unknown_master(&error), "{error}");
        assert!(!is_no_primary(&error));
        assert!(error.to_string().contains("`mymastr`"), "{error}");
        assert!(!retryable(&error));
    }
}
