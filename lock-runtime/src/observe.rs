//! Metrics, through the `metrics` facade (the program installs the
//! exporter), behind the `metrics` Cargo feature; without it every function
//! here is empty. Names, labels and units are in the guide (`guide/observability.md`, "Metrics").
//!
//! The `lock` label is the lock's *template*, never a rendered name: the
//! attribute's key as written (`order:<id>`), or what the manual API names
//! with `Lock::metric_label`, else [`DEFAULT_METRIC_LABEL`]. So ids and
//! dates in names never make a series each.

use std::time::Duration;

use crate::error::LostCause;

/// The `lock` label of a lock taken by the manual API without
/// `metric_label`: one series for all of them, whatever their names.
pub(crate) const DEFAULT_METRIC_LABEL: &str = "unlabelled";

/// Describes every metric (help text and unit), once per process: at the
/// first metric the library records, so with the recorder installed then.
#[cfg(feature = "metrics")]
fn describe() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(describe_metrics);
}

/// Describes the library's metrics (help text and unit: what an exporter
/// prints as `# HELP` and `# UNIT`) to the recorder installed now.
///
/// The library does it by itself, once per process, when it records its
/// first metric; call this only if the program installs its recorder after
/// its first lock was taken.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "lock_acquisitions_total",
        Unit::Count,
        "Lock acquisitions, by lock template and outcome (acquired, busy, timed_out, error)"
    );
    describe_histogram!(
        "lock_wait_seconds",
        Unit::Seconds,
        "Time from the start of an acquisition to the lock (acquired) or to the end of its wait \
         (timed_out)"
    );
    describe_histogram!(
        "lock_hold_seconds",
        Unit::Seconds,
        "Time from acquisition to release (outcome released) or to the loss the holder was told \
         of (outcome lost)"
    );
    describe_counter!(
        "lock_lost_total",
        Unit::Count,
        "Holds found lost, once per hold, by lock template and cause"
    );
    describe_counter!(
        "lock_handoffs_total",
        Unit::Count,
        "Locks passed to the next waiting task of the same client without a release"
    );
    describe_counter!(
        "lock_renewals_total",
        Unit::Count,
        "Renewals sent (one per renewed lock per renewal)"
    );
    describe_counter!(
        "lock_renewal_round_trips_total",
        Unit::Count,
        "Round trips to Redis made by the renewal driver (each carries many renewals)"
    );
    describe_gauge!(
        "lock_acknowledged_replicas",
        Unit::Count,
        "Acknowledged mode: the replicas the Redis primary had connected when a write was last \
         refused for too few confirmations"
    );
}

/// An acquisition of a lock labelled `label` ended: `outcome` is
/// `acquired`, `busy`, `timed_out` or `error`; `waited` is recorded for the
/// acquired and timed-out ones.
pub(crate) fn acquisition(label: &str, outcome: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let lock = label.to_owned();
        metrics::counter!("lock_acquisitions_total", "lock" => lock.clone(), "outcome" => outcome)
            .increment(1);
        if matches!(outcome, "acquired" | "timed_out") {
            metrics::histogram!("lock_wait_seconds", "lock" => lock).record(waited.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, outcome, waited);
}

/// A hold ended after `held`: `outcome` is `released` (its release found
/// it held) or `lost`.
pub(crate) fn hold_ended(label: &str, outcome: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::histogram!("lock_hold_seconds", "lock" => label.to_owned(), "outcome" => outcome)
            .record(held.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, outcome, held);
}

/// A hold was found lost.
pub(crate) fn lost(label: &str, cause: LostCause) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("lock_lost_total", "lock" => label.to_owned(), "cause" => cause.label())
            .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (label, cause);
}

/// The lock was passed to the next task of the process.
pub(crate) fn handed_off(label: &str) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("lock_handoffs_total", "lock" => label.to_owned()).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = label;
}

/// `renewals` renewals were sent.
pub(crate) fn renewals(renewals: u64) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("lock_renewals_total").increment(renewals);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = renewals;
}

/// One round trip of renewals was made.
pub(crate) fn renewal_round_trip() {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("lock_renewal_round_trips_total").increment(1);
    }
}

/// Acknowledged mode: the primary had `connected` replicas when a write was
/// refused for too few confirmations.
pub(crate) fn acknowledged_replicas(connected: u32) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::gauge!("lock_acknowledged_replicas").set(f64::from(connected));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = connected;
}
