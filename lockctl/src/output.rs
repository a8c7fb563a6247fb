//! What lockctl prints: tables for people, JSON (serde_json) for programs.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::admin::{Holder, HolderRecord, HolderRole, LockInfo, LockKind};
use serde_json::{json, Value};

/// The columns of `list` and `watch`.
const COLUMNS: [&str; 9] = [
    "NAME", "KIND", "TTL", "WAITERS", "FENCE", "HOLDER", "INSTANCE", "SINCE", "FUNCTION",
];

/// What a holder without a holder record is shown as.
pub const NO_RECORD: &str = "unknown (no record)";

/// `locks` as a table with a header line; a line saying so when empty.
/// `now`: the time the holders' ages are counted to.
pub fn table(locks: &[LockInfo], now: SystemTime) -> String {
    if locks.is_empty() {
        return "no locks\n".to_owned();
    }
    let rows: Vec<[String; 9]> = locks
        .iter()
        .map(|lock| {
            let holding: Vec<&Holder> = lock.holding().collect();
            [
                lock.name.clone(),
                kind_cell(lock),
                lock.ttl().map_or_else(|| "-".to_owned(), duration),
                lock.waiters.to_string(),
                lock.fencing_token
                    .map_or_else(|| "-".to_owned(), |fence| fence.to_string()),
                holder_cell(lock),
                instance_cell(&holding),
                since_cell(&holding, now),
                function_cell(&holding),
            ]
        })
        .collect();
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&COLUMNS);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// `lock`, `rw`, or `semaphore 2/5` (permits held of the capacity).
fn kind_cell(lock: &LockInfo) -> String {
    match (lock.kind, lock.capacity) {
        (LockKind::Semaphore, Some(capacity)) => {
            format!("semaphore {}/{capacity}", lock.permits_held())
        }
        (kind, _) => kind.to_string(),
    }
}

/// The holder's token head and role; `-` when free; `3 readers` for
/// several. Over a quorum, on how many nodes.
fn holder_cell(lock: &LockInfo) -> String {
    let holding: Vec<&Holder> = lock.holding().collect();
    match holding.as_slice() {
        [] => "-".to_owned(),
        [holder] => {
            let mut cell = holder.token_head().to_owned();
            match holder.role {
                HolderRole::Kept => cell.push_str(" kept"),
                HolderRole::Writer => cell.push_str(" (w)"),
                HolderRole::KeptWriter => cell.push_str(" (w) kept"),
                HolderRole::Reader => cell.push_str(" (r)"),
                HolderRole::Permits(k) => {
                    let _ = write!(cell, " ({k})");
                }
                _ => {}
            }
            if lock.nodes > 1 {
                let _ = write!(cell, " on {}/{}", holder.nodes, lock.nodes);
            }
            cell
        }
        several if several.iter().all(|h| h.role == HolderRole::Reader) => {
            format!("{} readers", several.len())
        }
        several => format!("{} holders", several.len()),
    }
}

/// One value for several holders: the value if they agree, else `n <what>`.
fn agreed(values: BTreeSet<String>, what: &str) -> String {
    match values.len() {
        0 => "-".to_owned(),
        1 => values.into_iter().next().unwrap_or_default(),
        n => format!("{n} {what}"),
    }
}

/// The holders' instance, from their records.
fn instance_cell(holding: &[&Holder]) -> String {
    agreed(
        holding
            .iter()
            .map(|holder| {
                holder
                    .record
                    .as_ref()
                    .map_or_else(|| NO_RECORD.to_owned(), |record| record.instance.clone())
            })
            .collect(),
        "instances",
    )
}

/// How long the holder (the longest-held of several) has held the lock.
fn since_cell(holding: &[&Holder], now: SystemTime) -> String {
    holding
        .iter()
        .filter_map(|holder| holder.record.as_ref()?.since)
        .min()
        .map_or_else(
            || "-".to_owned(),
            |since| duration(now.duration_since(since).unwrap_or_default()),
        )
}

/// The function that took the lock, from the records.
fn function_cell(holding: &[&Holder]) -> String {
    agreed(
        holding
            .iter()
            .filter_map(|holder| holder.record.as_ref()?.function.clone())
            .collect(),
        "functions",
    )
}

/// `850ms`, `29.5s`, `12m05s`, `3h02m`.
pub fn duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60)
    }
}

/// `time` in RFC 3339, UTC, to the millisecond: `2026-11-23T14:03:07.250Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs();
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The Gregorian date `days` days after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A holder's record as `show` prints it, or [`NO_RECORD`] with what it
/// may mean for a holder of this `role`.
fn record_lines(record: Option<&HolderRecord>, role: &HolderRole, now: SystemTime) -> String {
    let Some(record) = record else {
        let why = if matches!(role, HolderRole::Kept | HolderRole::KeptWriter) {
            "the lock was released and is kept by hold_at_least; the process that released it \
             has no holder record now: it ended since (the record goes with its client), it \
             cannot reach Redis, or it runs an older lock-runtime"
        } else {
            "no holder record names this holder's client. Either it took the lock under a \
             second ago (holds are recorded after a second: run show again), or its Redis user \
             may not write the record (no `hset`: its process logged a warning), or it runs an \
             older lock-runtime, or its process has not written the record for a minute (dead, \
             or cut off from Redis: a record expires 60 s after its last write)"
        };
        return format!("    instance: {NO_RECORD}: {why}\n");
    };
    let mut out = String::new();
    let pid = record
        .pid
        .map_or_else(|| "unknown".to_owned(), |pid| pid.to_string());
    let _ = writeln!(
        out,
        "    instance: {} (host {}, pid {pid}, lock-runtime {}, client {})",
        record.instance, record.host, record.version, record.client
    );
    let _ = writeln!(
        out,
        "    function: {}",
        record
            .function
            .as_deref()
            .unwrap_or("unknown (not recorded: no caller given, or held under a second)")
    );
    if let Some(since) = record.since {
        let _ = writeln!(
            out,
            "    since:    {} ({} ago)",
            rfc3339(since),
            duration(now.duration_since(since).unwrap_or_default())
        );
    }
    out
}

/// `show`: every field of each lock of the name, holders' full tokens and
/// records.
pub fn details(locks: &[LockInfo], now: SystemTime) -> String {
    let mut out = String::new();
    for lock in locks {
        let state = if lock.is_held() { "held" } else { "free" };
        let _ = writeln!(out, "{} ({}, key {})", lock.name, kind_cell(lock), lock.key);
        let _ = writeln!(out, "  state:    {state}");
        for holder in &lock.holders {
            let ttl = holder.ttl.map_or_else(|| "no expiry".to_owned(), duration);
            let _ = write!(
                out,
                "  holder:   {}  {}  ttl {ttl}",
                holder.token, holder.role
            );
            if lock.nodes > 1 {
                let majority = if holder.nodes > lock.nodes / 2 {
                    ""
                } else {
                    " (a minority: does not hold it)"
                };
                let _ = write!(out, "  on {}/{} nodes{majority}", holder.nodes, lock.nodes);
            }
            out.push('\n');
            out.push_str(&record_lines(holder.record.as_ref(), &holder.role, now));
        }
        let _ = writeln!(out, "  waiters:  {}", lock.waiters);
        let fence = lock
            .fencing_token
            .map_or_else(|| "-".to_owned(), |fence| fence.to_string());
        let _ = writeln!(out, "  fencing:  {fence}");
    }
    out
}

/// A holder's record as JSON (`null` without one).
fn record_json(record: Option<&HolderRecord>) -> Value {
    match record {
        None => Value::Null,
        Some(record) => json!({
            "client": record.client,
            "instance": record.instance,
            "host": record.host,
            "pid": record.pid,
            "version": record.version,
            "client_started": record.client_started.map(rfc3339),
            "function": record.function,
            "since": record.since.map(rfc3339),
        }),
    }
}

/// `locks` as JSON values (one object per lock).
pub fn json_locks(locks: &[LockInfo]) -> Value {
    let millis = |duration: Option<Duration>| duration.map(|d| d.as_millis() as u64);
    Value::Array(
        locks
            .iter()
            .map(|lock| {
                let holders: Vec<Value> = lock
                    .holders
                    .iter()
                    .map(|holder| {
                        let (role, permits) = match holder.role {
                            HolderRole::Owner => ("owner", 0),
                            HolderRole::Kept => ("kept", 0),
                            HolderRole::Writer => ("writer", 0),
                            HolderRole::KeptWriter => ("kept-writer", 0),
                            HolderRole::Reader => ("reader", 0),
                            HolderRole::Permits(k) => ("permits", k),
                            _ => ("other", 0),
                        };
                        json!({
                            "token": holder.token,
                            "role": role,
                            "permits": permits,
                            "ttl_ms": millis(holder.ttl),
                            "nodes": holder.nodes,
                            "record": record_json(holder.record.as_ref()),
                        })
                    })
                    .collect();
                json!({
                    "name": lock.name,
                    "kind": lock.kind.as_str(),
                    "key": lock.key,
                    "held": lock.is_held(),
                    "ttl_ms": millis(lock.ttl()),
                    "waiters": lock.waiters,
                    "fencing_token": lock.fencing_token,
                    "capacity": lock.capacity,
                    "nodes": lock.nodes,
                    "holders": holders,
                })
            })
            .collect(),
    )
}

/// `locks` as a JSON array on one line.
pub fn json(locks: &[LockInfo]) -> String {
    format!("{}\n", json_locks(locks))
}

/// One `watch --json` line: the refresh's time (RFC 3339, UTC), its number,
/// and its locks or its error.
pub fn watch_line(time: SystemTime, refresh: u64, result: Result<&[LockInfo], &str>) -> String {
    let line = match result {
        Ok(locks) => json!({
            "time": rfc3339(time),
            "refresh": refresh,
            "locks": json_locks(locks),
        }),
        Err(error) => json!({
            "time": rfc3339(time),
            "refresh": refresh,
            "error": error,
        }),
    };
    format!("{line}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_durations() {
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(29_540)), "29.5s");
        assert_eq!(duration(Duration::from_secs(725)), "12m05s");
        assert_eq!(duration(Duration::from_secs(3 * 3600 + 120)), "3h02m");
    }

    #[test]
    fn formats_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        // date -u -d @1700000000.123 +%FT%T.%3NZ
        assert_eq!(rfc3339(at(1_700_000_000_123)), "2023-11-14T22:13:20.123Z");
        // A leap day, and the end of a year.
        assert_eq!(rfc3339(at(951_782_400_000)), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(at(1_735_689_599_999)), "2024-12-31T23:59:59.999Z");
    }

    #[test]
    fn an_empty_listing_says_so() {
        assert_eq!(table(&[], SystemTime::now()), "no locks\n");
        assert_eq!(json(&[]), "[]\n");
    }

    #[test]
    fn watch_lines_are_json_with_a_time() {
        let line = watch_line(UNIX_EPOCH, 2, Err("down \"here\""));
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(value["refresh"], 2);
        assert_eq!(value["error"], "down \"here\"");
        assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
    }
}
