//! Duration literals such as `"500ms"`, `"10s"`, `"2m"`, `"1h30m"`, parsed at
//! compile time.

use syn::LitStr;

const UNITS: &str = "`ms`, `s`, `m` or `h`";

/// The longest `ttl`, `max_hold` and `hold_at_least` the runtime accepts: one
/// year (365 days). Must match `MAX_TTL_MS` in lock-runtime/src/lock.rs.
pub(crate) const MAX_DURATION_MS: u64 = 365 * 24 * 3600 * 1000;

/// The shortest ttl of a renewed lock (`renew`): it is renewed every ttl/3 and
/// is valid for ttl minus a 1 % + 2 ms drift margin, which leaves no room below
/// this. Must match `MIN_RENEWED_TTL` in lock-runtime/src/lock.rs.
pub(crate) const MIN_RENEWED_TTL_MS: u64 = 10;

/// [`MAX_DURATION_MS`] as it is written in an attribute: `8760h`.
fn max_duration_text() -> String {
    format!("{}h", MAX_DURATION_MS / 3_600_000)
}

/// Parses the literal into whole milliseconds, or an error pointing at it.
pub(crate) fn parse_duration(name: &str, literal: &LitStr) -> syn::Result<u64> {
    parse_millis(&literal.value()).map_err(|problem| {
        syn::Error::new(
            literal.span(),
            format!(
                "invalid `{name}`: {problem}; write a number and a unit ({UNITS}), e.g. \"500ms\", \"10s\", \"1h30m\""
            ),
        )
    })
}

/// Rejects a `ttl`, `max_hold` or `hold_at_least` over a year, the runtime's
/// limit; `fix` ends the message with what else to do.
pub(crate) fn check_at_most_a_year(
    name: &str,
    literal: &LitStr,
    millis: u64,
    fix: &str,
) -> syn::Result<()> {
    if millis <= MAX_DURATION_MS {
        return Ok(());
    }
    let max = max_duration_text();
    Err(syn::Error::new(
        literal.span(),
        format!(
            "`{name}` of {} is over the limit of one year ({max}); write `{name} = \"{max}\"` or \
             less{fix}",
            literal.value().trim()
        ),
    ))
}

/// Rejects the ttl of a renewed lock under [`MIN_RENEWED_TTL_MS`], pointing at
/// the ttl literal.
pub(crate) fn check_renewed_ttl(literal: &LitStr, millis: u64) -> syn::Result<()> {
    if millis >= MIN_RENEWED_TTL_MS {
        return Ok(());
    }
    Err(syn::Error::new(
        literal.span(),
        format!(
            "`ttl` of {} is too short for a renewed lock: a renewed lock needs a ttl of at least \
             {MIN_RENEWED_TTL_MS}ms (it is renewed every ttl/3 and is valid for ttl minus a \
             1 % + 2 ms drift margin); write `ttl = \"{MIN_RENEWED_TTL_MS}ms\"` or more, or \
             remove `renew`",
            literal.value().trim()
        ),
    ))
}

fn parse_millis(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the duration is empty".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(if rest == text {
                format!("`{text}` does not start with a number")
            } else {
                format!("`{text}` has `{rest}` where a number should be")
            });
        }
        let number = &rest[..digits];
        rest = &rest[digits..];
        let unit_len = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let unit = &rest[..unit_len];
        let factor: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" if rest.is_empty() => return Err(format!("`{number}` has no unit")),
            "" => {
                return Err(format!(
                    "`{text}` has `{rest}` right after `{number}` where a unit should be"
                ))
            }
            other => return Err(format!("`{other}` is not a unit")),
        };
        rest = &rest[unit_len..];
        total = number
            .parse::<u64>()
            .ok()
            .and_then(|number| number.checked_mul(factor))
            .and_then(|part| total.checked_add(part))
            .ok_or_else(|| format!("`{text}` is too long"))?;
    }
    if total == 0 {
        return Err(format!("`{text}` is zero"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::{max_duration_text, parse_millis, MAX_DURATION_MS, MIN_RENEWED_TTL_MS};

    #[test]
    fn accepts_units_and_compounds() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("10s"), Ok(10_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("1m30s250ms"), Ok(90_250));
    }

    #[test]
    fn rejects_zero_missing_units_and_junk() {
        for bad in [
            "",
            "0s",
            "0ms",
            "10",
            "s",
            "1.5s",
            "10 s",
            "10sec",
            "-1s",
            "1h30",
            "99999999999999999999s",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn limits_match_the_runtime() {
        // lock-runtime/src/lock.rs: MAX_TTL_MS and MIN_RENEWED_TTL.
        assert_eq!(MAX_DURATION_MS, 31_536_000_000);
        assert_eq!(max_duration_text(), "8760h");
        assert_eq!(parse_millis("8760h"), Ok(MAX_DURATION_MS));
        assert_eq!(MIN_RENEWED_TTL_MS, 10);
    }

    mod properties {
        use proptest::prelude::*;

        use super::parse_millis;

        const UNITS: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

        /// An error says what is wrong.
        fn check(text: &str) -> Result<(), TestCaseError> {
            match parse_millis(text) {
                Ok(millis) => prop_assert!(millis > 0, "{text:?} gave 0"),
                Err(message) => prop_assert!(!message.trim().is_empty(), "{text:?}"),
            }
            Ok(())
        }

        proptest! {
            // No regression files written beside the sources.
            #![proptest_config(ProptestConfig {
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn arbitrary_strings_never_panic(text in any::<String>()) {
                check(&text)?;
            }

            #[test]
            fn near_misses_never_panic(text in "[0-9 .+_-]{0,6}[0-9hmsé ]{0,8}[a-z0-9]{0,4}") {
                check(&text)?;
            }

            #[test]
            fn number_unit_pairs_round_trip(
                parts in proptest::collection::vec((0u64..1_000_000, 0..UNITS.len()), 1..5),
                padding in "[ \t]{0,2}",
            ) {
                let mut text = padding.clone();
                let mut expected = 0u64;
                for &(number, unit) in &parts {
                    let (suffix, factor) = UNITS[unit];
                    text.push_str(&format!("{number}{suffix}"));
                    expected += number * factor;
                }
                text.push_str(&padding);
                if expected == 0 {
                    prop_assert!(parse_millis(&text).is_err(), "{text:?} was accepted");
                } else {
                    prop_assert_eq!(parse_millis(&text), Ok(expected), "{:?}", text);
                }
            }

            #[test]
            fn overflow_is_an_error(
                unit in 0..UNITS.len(),
                over in 1..=u128::from(u64::MAX),
                extra_digits in "[0-9]{0,3}",
            ) {
                // Over the largest number of this unit that fits in u64
                // milliseconds; more digits after it only make it larger.
                let (suffix, factor) = UNITS[unit];
                let number = u128::from(u64::MAX) / u128::from(factor) + over;
                let text = format!("{number}{extra_digits}{suffix}");
                let result = parse_millis(&text);
                prop_assert!(
                    matches!(&result, Err(message) if message.contains("too long")),
                    "{text:?} gave {result:?}"
                );
            }

            #[test]
            fn overflowing_sum_is_an_error(a in (u64::MAX / 2 + 1)..=u64::MAX, b in (u64::MAX / 2 + 1)..=u64::MAX) {
                // Each part fits on its own; the sum does not.
                let text = format!("{a}ms{b}ms");
                let result = parse_millis(&text);
                prop_assert!(
                    matches!(&result, Err(message) if message.contains("too long")),
                    "{text:?} gave {result:?}"
                );
            }
        }
    }
}
