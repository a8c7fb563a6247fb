//! How a simulator's answer is compared with the real server's.
//!
//! Exact, except numbers that depend on the time: an integer (or a number
//! in a string) of 1000 or more is a time or a ttl here (the universe's
//! counts and codes stay below 1000), compared within a tolerance
//! (timestamps in µs, ≥ 10^14, within 5 s; others within 5000).

use redis::Value;

fn number(bytes: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.parse::<f64>().ok().filter(|n| n.is_finite())
}

/// Whether two numbers agree: small ones exactly (as text, by the caller),
/// time-like ones within the tolerance.
fn close(a: f64, b: f64) -> bool {
    let big = a.abs().max(b.abs());
    if a.abs() < 1000.0 || b.abs() < 1000.0 {
        return a == b;
    }
    let tolerance = if big >= 1e14 { 5e6 } else { 5000.0 };
    (a - b).abs() <= tolerance
}

fn bytes_match(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    match (number(a), number(b)) {
        (Some(x), Some(y)) if x.abs() >= 1000.0 && y.abs() >= 1000.0 => close(x, y),
        _ => false,
    }
}

/// Compares two replies (simulator first).
pub fn replies(sim: &Value, real: &Value) -> Result<(), String> {
    if matches_value(sim, real) {
        Ok(())
    } else {
        Err(format!("simulator {sim:?}, real {real:?}"))
    }
}

fn matches_value(sim: &Value, real: &Value) -> bool {
    match (sim, real) {
        (Value::Int(a), Value::Int(b)) => a == b || close(*a as f64, *b as f64),
        (Value::BulkString(a), Value::BulkString(b)) => bytes_match(a, b),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| matches_value(x, y))
        }
        (Value::ServerError(a), Value::ServerError(b)) => {
            a.code() == b.code() && a.details() == b.details()
        }
        _ => sim == real,
    }
}

/// Compares the dumps of every key (`{type, pttl, content}` each).
pub fn states(keys: &[String], sim: &Value, real: &Value) -> Result<(), String> {
    let (Value::Array(sim), Value::Array(real)) = (sim, real) else {
        return Err(format!(
            "a dump is no array: simulator {sim:?}, real {real:?}"
        ));
    };
    for (i, key) in keys.iter().enumerate() {
        let (s, r) = (&sim[i], &real[i]);
        // The ttl of a key is read at each side's own time of the dump: a
        // short one differs by the latency between the two.
        let ttls_close = match (s, r) {
            (Value::Array(s), Value::Array(r)) if s.len() == 3 && r.len() == 3 => {
                match (&s[1], &r[1]) {
                    (Value::Int(a), Value::Int(b)) => {
                        a == b || (*a >= 0 && *b >= 0 && (a - b).abs() <= 5000)
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        let contents_match = match (s, r) {
            (Value::Array(s), Value::Array(r)) if s.len() == 3 && r.len() == 3 => {
                matches_value(&s[0], &r[0]) && matches_value(&s[2], &r[2])
            }
            _ => false,
        };
        // A short-lived key (the ttl of a step's short ttl, well under a
        // second) may be gone on one side and not yet on the other: the
        // two read it at times a step's latency apart.
        let dying = |dead: &Value, alive: &Value| match (dead, alive) {
            (Value::Array(d), Value::Array(a)) if d.len() == 3 && a.len() == 3 => {
                d[0] == Value::BulkString(b"none".to_vec())
                    && matches!(a[1], Value::Int(ttl) if (0..1000).contains(&ttl))
            }
            _ => false,
        };
        let agree = (ttls_close && contents_match) || dying(s, r) || dying(r, s);
        if !agree {
            return Err(format!("key {key}: simulator {s:?}, real {r:?}"));
        }
    }
    Ok(())
}
