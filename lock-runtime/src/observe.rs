//! Metrics, through the `metrics` facade (the program installs the
//! exporter), behind the `metrics` Cargo feature; without it every function
//! here is empty. Names, labels and units are in the guide (`guide/observability.md`, "Metrics").
//!
//! The `lock` label is the lock's *template*, never a rendered name: the
//! attribute's key as written (`order:<id>`), or what the manual API names
//! with `Lock::metric_label` (else its `Lock::caller`), else
//! [`DEFAULT_METRIC_LABEL`]. So ids and dates in names never make a series
//! each.
//!
//! Every name starts with a prefix, [`DEFAULT_METRIC_PREFIX`] unless the
//! program chose another with [`set_metric_prefix`] before the first
//! metric. Names end with their unit (`_seconds`, `_total`) as Prometheus
//! names do, and are described with it: an exporter that appends units
//! (metrics-exporter-prometheus with `with_recommended_naming(true)`) finds
//! it there and adds nothing. The first use of a template registers every
//! counter of it at zero, so that an alert on an increase sees the first
//! one.

use std::time::Duration;

use crate::error::{ConfigError, LostCause};

/// The `lock` label of a lock taken by the manual API without
/// `metric_label` or `caller`: one series for all of them, whatever their
/// names.
pub(crate) const DEFAULT_METRIC_LABEL: &str = "unlabelled";

/// The prefix of every metric's name unless [`set_metric_prefix`] chose
/// another: `distributed_lock_acquisitions_total`, ...
pub const DEFAULT_METRIC_PREFIX: &str = "distributed_lock_";

/// Every outcome of an acquisition (`acquisitions_total`'s `outcome`).
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 4] = ["acquired", "busy", "timed_out", "error"];

/// Sets the prefix of every metric's name (default
/// [`DEFAULT_METRIC_PREFIX`], `distributed_lock_`): e.g. `"billing_lock_"`
/// for `billing_lock_acquisitions_total`. Call it once, at start-up, before
/// the first lock: the names are fixed by the first metric recorded (or
/// described). Without the `metrics` feature it only checks the prefix.
///
/// # Errors
///
/// [`ConfigError::InvalidClientOption`] when the prefix is not a Prometheus
/// name's start (ASCII letters, digits, `_` and `:`, not starting with a
/// digit), or when the names were already fixed with another prefix.
pub fn set_metric_prefix(prefix: impl Into<String>) -> Result<(), ConfigError> {
    let prefix = prefix.into();
    let invalid = |reason: String| ConfigError::InvalidClientOption {
        option: "metric prefix",
        reason,
    };
    let valid = !prefix.is_empty()
        && !prefix.starts_with(|c: char| c.is_ascii_digit())
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !valid {
        return Err(invalid(format!(
            "`{prefix}` cannot start a Prometheus metric name: use ASCII letters, digits, `_` \
             and `:`, not starting with a digit (e.g. `billing_lock_`)"
        )));
    }
    #[cfg(feature = "metrics")]
    {
        let prefix: &'static str = Box::leak(prefix.into_boxed_str());
        let chosen = names::PREFIX.get_or_init(|| prefix);
        if *chosen != prefix {
            return Err(invalid(format!(
                "the metric names were already fixed with the prefix `{chosen}` (by an earlier \
                 call, or by the first metric recorded): set it once, at start-up, before the \
                 first lock"
            )));
        }
    }
    Ok(())
}

#[cfg(feature = "metrics")]
mod names {
    use std::collections::HashSet;
    use std::sync::{OnceLock, RwLock};

    /// The prefix in force: set by `set_metric_prefix`, or the default at
    /// the first metric.
    pub(super) static PREFIX: OnceLock<&'static str> = OnceLock::new();

    /// The metrics' full names, made once.
    pub(super) struct Names {
        pub(super) acquisitions: &'static str,
        pub(super) wait: &'static str,
        pub(super) hold: &'static str,
        pub(super) lost: &'static str,
        pub(super) handoffs: &'static str,
        pub(super) renewals: &'static str,
        pub(super) renewal_round_trips: &'static str,
        pub(super) renewal_failures: &'static str,
        pub(super) held: &'static str,
        pub(super) acknowledged_replicas: &'static str,
    }

    pub(super) fn names() -> &'static Names {
        static NAMES: OnceLock<Names> = OnceLock::new();
        NAMES.get_or_init(|| {
            let prefix = *PREFIX.get_or_init(|| super::DEFAULT_METRIC_PREFIX);
            let name = |suffix: &str| -> &'static str {
                Box::leak(format!("{prefix}{suffix}").into_boxed_str())
            };
            Names {
                acquisitions: name("acquisitions_total"),
                wait: name("wait_seconds"),
                hold: name("hold_seconds"),
                lost: name("lost_total"),
                handoffs: name("handoffs_total"),
                renewals: name("renewals_total"),
                renewal_round_trips: name("renewal_round_trips_total"),
                renewal_failures: name("renewal_failures_total"),
                held: name("held_locks"),
                acknowledged_replicas: name("acknowledged_replicas"),
            }
        })
    }

    /// Templates whose counters are registered (bounded by the code).
    pub(super) fn first_use(label: &str) -> bool {
        static SEEN: OnceLock<RwLock<HashSet<Box<str>>>> = OnceLock::new();
        let seen = SEEN.get_or_init(Default::default);
        if seen
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(label)
        {
            return false;
        }
        seen.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(label.into())
    }
}

/// Describes every metric (help text and unit), once per process: at the
/// first metric the library records, so with the recorder installed then.
#[cfg(feature = "metrics")]
fn describe() -> &'static names::Names {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(describe_metrics);
    names::names()
}

/// Describes the library's metrics (help text and unit) to the recorder
/// installed now.
///
/// The library does it by itself, once per process, when it records its
/// first metric; call this only if the program installs its recorder after
/// its first lock was taken.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    let names = names::names();
    describe_counter!(
        names.acquisitions,
        Unit::Count,
        "Lock acquisitions, by lock template and outcome (acquired, busy, timed_out, error); a \
         set of N locks counts N"
    );
    describe_histogram!(
        names.wait,
        Unit::Seconds,
        "Time from the start of an acquisition to the lock (acquired) or to the end of its wait \
         (timed_out)"
    );
    describe_histogram!(
        names.hold,
        Unit::Seconds,
        "Time from acquisition to release (outcome released) or to the loss the holder was told \
         of (outcome lost)"
    );
    describe_counter!(
        names.lost,
        Unit::Count,
        "Holds found lost, once per hold, by lock template and cause"
    );
    describe_counter!(
        names.handoffs,
        Unit::Count,
        "Locks passed to the next waiting task of the same client without a release"
    );
    describe_counter!(
        names.renewals,
        Unit::Count,
        "Renewals sent (one per renewed lock per renewal)"
    );
    describe_counter!(
        names.renewal_round_trips,
        Unit::Count,
        "Round trips to Redis made by the renewal driver (each carries many renewals)"
    );
    describe_counter!(
        names.renewal_failures,
        Unit::Count,
        "Renewals not confirmed (no answer, an error, no majority), by lock template: retried \
         while the lock is valid; a rise comes before losses"
    );
    describe_gauge!(
        names.held,
        Unit::Count,
        "Locks this process holds now, by lock template"
    );
    describe_gauge!(
        names.acknowledged_replicas,
        Unit::Count,
        "Acknowledged mode: the replicas the Redis primary had connected when a write was last \
         refused for too few confirmations"
    );
}

/// The first use of the template `label`: every counter of it at zero.
#[cfg(feature = "metrics")]
fn register(names: &names::Names, label: &str) {
    if !names::first_use(label) {
        return;
    }
    for outcome in OUTCOMES {
        metrics::counter!(names.acquisitions, "lock" => label.to_owned(), "outcome" => outcome)
            .increment(0);
    }
    for code in 1..=9 {
        let cause = LostCause::from_code(code).label();
        metrics::counter!(names.lost, "lock" => label.to_owned(), "cause" => cause).increment(0);
    }
    metrics::counter!(names.handoffs, "lock" => label.to_owned()).increment(0);
    metrics::counter!(names.renewal_failures, "lock" => label.to_owned()).increment(0);
    metrics::gauge!(names.held, "lock" => label.to_owned()).increment(0.0);
}

/// `count` acquisitions of locks labelled `label` ended (a set counts each
/// of its locks): `outcome` is `acquired`, `busy`, `timed_out` or `error`;
/// `waited` is recorded for the acquired and timed-out ones.
pub(crate) fn acquisition(label: &str, outcome: &'static str, waited: Duration, count: u64) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        register(names, label);
        let lock = label.to_owned();
        metrics::counter!(names.acquisitions, "lock" => lock.clone(), "outcome" => outcome)
            .increment(count);
        if matches!(outcome, "acquired" | "timed_out") {
            let histogram = metrics::histogram!(names.wait, "lock" => lock);
            for _ in 0..count {
                histogram.record(waited.as_secs_f64());
            }
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, outcome, waited, count);
}

/// A hold of a lock labelled `label` began (`true`) or ended: the held
/// gauge.
pub(crate) fn holding(label: &str, held: bool) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        register(names, label);
        let gauge = metrics::gauge!(names.held, "lock" => label.to_owned());
        if held {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, held);
}

/// A hold ended after `held`: `outcome` is `released` (its release found
/// it held) or `lost`.
pub(crate) fn hold_ended(label: &str, outcome: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::histogram!(names.hold, "lock" => label.to_owned(), "outcome" => outcome)
            .record(held.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, outcome, held);
}

/// A hold was found lost.
pub(crate) fn lost(label: &str, cause: LostCause) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        register(names, label);
        metrics::counter!(names.lost, "lock" => label.to_owned(), "cause" => cause.label())
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, cause);
}

/// The lock was passed to the next task of the process.
pub(crate) fn handed_off(label: &str) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::counter!(names.handoffs, "lock" => label.to_owned()).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = label;
}

/// `renewals` renewals were sent.
pub(crate) fn renewals(renewals: u64) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::counter!(names.renewals).increment(renewals);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = renewals;
}

/// A renewal of a lock labelled `label` was not confirmed (it is retried
/// while the lock is valid).
pub(crate) fn renewal_failed(label: &str) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::counter!(names.renewal_failures, "lock" => label.to_owned()).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = label;
}

/// One round trip of renewals was made.
pub(crate) fn renewal_round_trip() {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::counter!(names.renewal_round_trips).increment(1);
    }
}

/// Acknowledged mode: the primary had `connected` replicas when a write was
/// refused for too few confirmations.
pub(crate) fn acknowledged_replicas(connected: u32) {
    #[cfg(feature = "metrics")]
    {
        let names = describe();
        metrics::gauge!(names.acknowledged_replicas).set(f64::from(connected));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = connected;
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_must_start_a_prometheus_name() {
        for bad in ["", "9lock_", "lock-", "lock ", "löck_"] {
            assert!(super::set_metric_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
