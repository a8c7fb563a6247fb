//! What lockctl prints: tables for people, JSON for programs.

use std::fmt::Write as _;
use std::time::Duration;

use lock_runtime::admin::{Holder, HolderRole, LockInfo, LockKind};

/// The columns of `list` and `watch`.
const COLUMNS: [&str; 6] = ["NAME", "KIND", "TTL", "WAITERS", "HOLDER", "FENCE"];

/// `locks` as a table with a header line; a line saying so when empty.
pub fn table(locks: &[LockInfo]) -> String {
    if locks.is_empty() {
        return "no locks\n".to_owned();
    }
    let rows: Vec<[String; 6]> = locks
        .iter()
        .map(|lock| {
            [
                lock.name.clone(),
                kind_cell(lock),
                lock.ttl().map_or_else(|| "-".to_owned(), duration),
                lock.waiters.to_string(),
                holder_cell(lock),
                lock.fencing_token
                    .map_or_else(|| "-".to_owned(), |fence| fence.to_string()),
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

/// `show`: every field of each lock of the name, holders' full tokens.
pub fn details(name: &str, locks: &[LockInfo]) -> String {
    if locks.is_empty() {
        return format!("lock `{name}`: free (no key of it in Redis: no holder, no waiter)\n");
    }
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
        }
        let _ = writeln!(out, "  waiters:  {}", lock.waiters);
        let fence = lock
            .fencing_token
            .map_or_else(|| "-".to_owned(), |fence| fence.to_string());
        let _ = writeln!(out, "  fencing:  {fence}");
    }
    out
}

/// `locks` as a JSON array (one object per lock).
pub fn json(locks: &[LockInfo]) -> String {
    let mut out = String::from("[");
    for (i, lock) in locks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"name\":{},\"kind\":{},\"key\":{},\"held\":{},\"ttl_ms\":{},\"waiters\":{},\
             \"fencing_token\":{},\"capacity\":{},\"nodes\":{},\"holders\":[",
            string(&lock.name),
            string(lock.kind.as_str()),
            string(&lock.key),
            lock.is_held(),
            millis(lock.ttl()),
            lock.waiters,
            lock.fencing_token
                .map_or_else(|| "null".to_owned(), |fence| fence.to_string()),
            lock.capacity
                .map_or_else(|| "null".to_owned(), |capacity| capacity.to_string()),
            lock.nodes,
        );
        for (j, holder) in lock.holders.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let (role, permits) = match holder.role {
                HolderRole::Owner => ("owner", 0),
                HolderRole::Kept => ("kept", 0),
                HolderRole::Writer => ("writer", 0),
                HolderRole::KeptWriter => ("kept-writer", 0),
                HolderRole::Reader => ("reader", 0),
                HolderRole::Permits(k) => ("permits", k),
                _ => ("other", 0),
            };
            let _ = write!(
                out,
                "{{\"token\":{},\"role\":\"{role}\",\"permits\":{permits},\"ttl_ms\":{},\
                 \"nodes\":{}}}",
                string(&holder.token),
                millis(holder.ttl),
                holder.nodes
            );
        }
        out.push_str("]}");
    }
    out.push_str("]\n");
    out
}

fn millis(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "null".to_owned(), |d| d.as_millis().to_string())
}

/// A JSON string literal.
fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
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
    fn escapes_json_strings() {
        assert_eq!(string("a\"b\\c\nd\u{1}é"), "\"a\\\"b\\\\c\\nd\\u0001é\"");
    }

    #[test]
    fn an_empty_listing_says_so() {
        assert_eq!(table(&[]), "no locks\n");
        assert_eq!(json(&[]), "[]\n");
    }
}
