//! Durations in messages, as a person writes them: `850ms`, `2s`, `2.5s`,
//! `1m30s`, `2h5m`, never `2.000123456s`.

use std::fmt;
use std::time::Duration;

/// `duration` shown readably (see the module); what `Display` of a
/// [`LockError`](crate::LockError) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readable(pub(crate) Duration);

impl fmt::Display for Readable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        let micros = duration.as_micros();
        if micros < 1_000 {
            return write!(f, "{micros}µs");
        }
        let millis = duration.as_millis();
        if millis < 1_000 {
            // Tenths of a millisecond below 10 ms, else whole ones.
            if millis < 10 && micros % 1_000 >= 100 {
                return write!(f, "{:.1}ms", micros as f64 / 1_000.0);
            }
            return write!(f, "{millis}ms");
        }
        if millis < 60_000 {
            // Up to three decimals, trailing zeros dropped.
            let seconds = format!("{:.3}", millis as f64 / 1_000.0);
            let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
            return write!(f, "{seconds}s");
        }
        // Whole seconds from here: the parts that are not zero.
        let seconds = (millis + 500) / 1_000;
        let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        if seconds > 0 {
            write!(f, "{seconds}s")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Readable;

    #[test]
    fn durations_read_as_people_write_them() {
        for (duration, shown) in [
            (Duration::from_nanos(1), "0µs"),
            (Duration::from_micros(250), "250µs"),
            (Duration::from_micros(2_500), "2.5ms"),
            (Duration::from_nanos(32_617_313), "32ms"),
            (Duration::from_millis(850), "850ms"),
            (Duration::from_millis(2_000), "2s"),
            (Duration::from_nanos(2_000_123_456), "2s"),
            (Duration::from_millis(2_500), "2.5s"),
            (Duration::from_millis(29_999), "29.999s"),
            (Duration::from_secs(60), "1m"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(7_500), "2h5m"),
            (Duration::from_secs(8_760 * 3_600), "8760h"),
        ] {
            assert_eq!(Readable(duration).to_string(), shown, "{duration:?}");
        }
    }
}
