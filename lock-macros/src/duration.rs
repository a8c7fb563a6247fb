//! Duration literals such as `"500ms"`, `"10s"`, `"2m"`, `"1h30m"`, parsed at
//! compile time.

use syn::LitStr;

const UNITS: &str = "`ms`, `s`, `m` or `h`";

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
    use super::parse_millis;

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
}
