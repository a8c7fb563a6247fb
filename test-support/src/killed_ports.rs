//! The ports of servers tests killed lately, shared by every test process
//! (nextest runs each test in its own) through a file in the temporary
//! directory: a client of the test that killed a server reconnects to its
//! port and must be refused, not answered by a server another test started
//! on the port given back (`tests/quorum.rs`
//! `a_failing_waiter_keeps_trying_until_its_wait_ends` took the lock "on 2
//! of 3 killed nodes" in 1 run of 10 beside busy loops).

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a killed server's port is not handed out.
const QUARANTINE: Duration = Duration::from_secs(180);

fn file() -> PathBuf {
    std::env::temp_dir().join("test-support-killed-ports")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// `port`'s server was killed now. Best effort: one short appended line.
pub(crate) fn note(port: u16) {
    let line = format!("{port} {}\n", now_secs());
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file())
    {
        let _ = file.write_all(line.as_bytes());
    }
}

/// The ports killed within the quarantine.
pub(crate) fn recent() -> HashSet<u16> {
    let since = now_secs().saturating_sub(QUARANTINE.as_secs());
    std::fs::read_to_string(file())
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (port, at) = line.split_once(' ')?;
            (at.parse::<u64>().ok()? >= since).then_some(port.parse().ok()?)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_port_noted_is_recent() {
        super::note(1);
        assert!(super::recent().contains(&1));
    }
}
