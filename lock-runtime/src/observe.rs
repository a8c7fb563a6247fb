//! Metrics, through the `metrics` facade (the program installs the
//! exporter), behind the `metrics` Cargo feature; without it every function
//! here is empty. Names and labels are in the README ("Metrics").
//!
//! The `lock` label is the lock name's text before its first `:` (`order:42`
//! → `order`, `lottery:2026-11-23` → `lottery`, `exports` → `exports`), so
//! that names made per id or per date do not make a series each.

use std::time::Duration;

use crate::error::LostCause;

/// The `lock` label of the lock `name`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn label(name: &str) -> String {
    name.split(':').next().unwrap_or(name).to_owned()
}

/// An acquisition ended: `outcome` is `acquired`, `busy`, `timed_out` or
/// `error`; `waited` is recorded for the acquired and timed-out ones.
pub(crate) fn acquisition(name: &str, outcome: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let lock = label(name);
        metrics::counter!("lock_acquisitions_total", "lock" => lock.clone(), "outcome" => outcome)
            .increment(1);
        if matches!(outcome, "acquired" | "timed_out") {
            metrics::histogram!("lock_wait_seconds", "lock" => lock).record(waited.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, outcome, waited);
}

/// A hold ended by its release, after `held`.
pub(crate) fn released(name: &str, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lock_hold_seconds", "lock" => label(name)).record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (name, held);
}

/// A hold was found lost.
pub(crate) fn lost(name: &str, cause: LostCause) {
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_lost_total", "lock" => label(name), "cause" => cause.label())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, cause);
}

/// The lock was passed to the next task of the process.
pub(crate) fn handed_off(name: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_handoffs_total", "lock" => label(name)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = name;
}

/// `renewals` renewals were sent.
pub(crate) fn renewals(renewals: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_renewals_total").increment(renewals);
    #[cfg(not(feature = "metrics"))]
    let _ = renewals;
}

/// One round trip of renewals was made.
pub(crate) fn renewal_round_trip() {
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_renewal_round_trips_total").increment(1);
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_keep_the_text_before_the_first_colon() {
        assert_eq!(super::label("order:42"), "order");
        assert_eq!(super::label("lottery:2026-11-23:noon"), "lottery");
        assert_eq!(super::label("exports"), "exports");
    }
}
