//! Numbers read from and written into arguments and replies, the way Redis
//! 7.0 reads (`string2ll`, `strtod`) and writes (`%.17g`) them.

/// An integer argument as Redis's `string2ll` accepts it: optional `-`,
/// digits, no leading zero (but `0` itself), no `+`, no spaces, within
/// `i64`.
pub(crate) fn parse_i64(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    if bytes == b"0" {
        return Some(0);
    }
    let (negative, digits) = match bytes[0] {
        b'-' => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    if digits.is_empty() || !(b'1'..=b'9').contains(&digits[0]) {
        return None;
    }
    let mut value: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    if negative {
        if value > (i64::MAX as u64) + 1 {
            return None;
        }
        Some((value as i64).wrapping_neg())
    } else {
        i64::try_from(value).ok()
    }
}

/// `strtod` over the whole argument (leading spaces allowed when `spaces`);
/// `None` when characters are left over or nothing was read. Hexadecimal
/// floats (which `strtod` also reads) are not accepted.
fn strtod(bytes: &[u8], spaces: bool) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let text = if spaces {
        text.trim_start_matches(|c: char| c.is_ascii_whitespace())
    } else {
        text
    };
    if text.is_empty() {
        // strtod reads nothing and leaves the end pointer at the start,
        // which is the end of the string: Redis takes it as 0.
        return if bytes.is_empty() { Some(0.0) } else { None };
    }
    text.parse::<f64>().ok()
}

/// A float argument as `getDoubleFromObject` accepts it (ZADD's scores):
/// no leading space, no NaN, no overflow or underflow.
pub(crate) fn parse_f64(bytes: &[u8]) -> Option<f64> {
    if bytes.is_empty() || bytes[0].is_ascii_whitespace() {
        return None;
    }
    let value = strtod(bytes, false)?;
    if value.is_nan() {
        return None;
    }
    let lower = bytes.to_ascii_lowercase();
    let says_inf = lower.windows(3).any(|w| w == b"inf");
    if value.is_infinite() && !says_inf {
        return None; // ERANGE: overflow
    }
    if value == 0.0 && mantissa_has_nonzero_digit(&lower) {
        return None; // ERANGE: underflow
    }
    Some(value)
}

fn mantissa_has_nonzero_digit(lower: &[u8]) -> bool {
    lower
        .iter()
        .take_while(|&&b| b != b'e')
        .any(|b| (b'1'..=b'9').contains(b))
}

/// A bound of a score range (`zslParseRange`): `(` for an exclusive one,
/// then what `strtod` reads (spaces first allowed, no NaN). Returns the
/// value and whether it is exclusive.
pub(crate) fn parse_score_bound(bytes: &[u8]) -> Option<(f64, bool)> {
    let (exclusive, rest) = match bytes.first() {
        Some(b'(') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    let value = strtod(rest, true)?;
    if value.is_nan() {
        return None;
    }
    Some((value, exclusive))
}

/// A double as C's `printf("%.17g")` writes it: how Redis 7.0 replies with
/// a score in RESP2 and turns a Lua number into a command argument.
/// (Redis 7.2 and Valkey write the shortest form that reads back the same,
/// `fpconv_dtoa`: `0.1` instead of `0.10000000000000001`.)
pub(crate) fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "nan".to_owned();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if d == 0.0 {
        return if d.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    const PRECISION: i32 = 17;
    let scientific = format!("{:.*e}", (PRECISION - 1) as usize, d);
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("a formatted float has an exponent");
    let exponent: i32 = exponent.parse().expect("a formatted exponent is a number");
    if !(-4..PRECISION).contains(&exponent) {
        let mantissa = trim_fraction(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        let decimals = (PRECISION - 1 - exponent) as usize;
        trim_fraction(&format!("{d:.decimals$}")).to_owned()
    }
}

/// `1.2300` -> `1.23`, `5.000` -> `5` (what `%g` drops).
fn trim_fraction(text: &str) -> &str {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_read_as_string2ll_reads_them() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"01"[..],
            b"+1",
            b" 1",
            b"1 ",
            b"-0",
            b"",
            b"-",
            b"1.0",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn doubles_are_written_as_printf_g17() {
        let cases = [
            (0.1, "0.10000000000000001"),
            (1.5, "1.5"),
            (1700000000123.0, "1700000000123"),
            (1e17, "1e+17"),
            (1.5e17, "1.5e+17"),
            (1e16, "10000000000000000"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (-2.0, "-2"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (123456789012345680.0, "1.2345678901234568e+17"),
        ];
        for (value, text) in cases {
            assert_eq!(format_double(value), text);
        }
    }

    #[test]
    fn floats_are_read_as_redis_reads_them() {
        assert_eq!(parse_f64(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_f64(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64(b"1e3"), Some(1000.0));
        assert_eq!(parse_f64(b"nan"), None);
        assert_eq!(parse_f64(b"1e400"), None);
        assert_eq!(parse_f64(b" 1"), None);
        assert_eq!(parse_f64(b"abc"), None);
        assert_eq!(parse_score_bound(b"(5"), Some((5.0, true)));
        assert_eq!(parse_score_bound(b"-inf"), Some((f64::NEG_INFINITY, false)));
        assert_eq!(parse_score_bound(b"x"), None);
    }
}
