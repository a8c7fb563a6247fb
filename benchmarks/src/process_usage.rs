//! Resident memory and CPU time of this process, and Redis's CPU time.

use std::time::Duration;

use crate::target::Target;

/// Resident set size of this process, in bytes.
pub(crate) fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page_size
}

pub(crate) use crate::cpu_time::cpu_time;

/// used_cpu_sys + used_cpu_user of the Redis server, from INFO cpu; of every
/// node, added up, for a cluster.
pub(crate) fn redis_cpu(target: &impl Target) -> Duration {
    target
        .ports()
        .into_iter()
        .map(|port| {
            let info = info(port, "cpu");
            Duration::from_secs_f64(
                info_field(&info, "used_cpu_sys:") + info_field(&info, "used_cpu_user:"),
            )
        })
        .sum()
}

/// Reads Redis has done from its clients' sockets (INFO stats): divided into
/// the commands, how well clients batch their requests. Every node's, for a
/// cluster.
pub(crate) fn redis_reads(target: &impl Target) -> u64 {
    target
        .ports()
        .into_iter()
        .map(|port| info_field(&info(port, "stats"), "total_reads_processed:") as u64)
        .sum()
}

/// Calls of `command` (lower case, e.g. `evalsha`) Redis has run (INFO
/// commandstats); every node's, for a cluster.
pub(crate) fn calls(target: &impl Target, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    target
        .ports()
        .into_iter()
        .filter_map(|port| {
            info(port, "commandstats")
                .lines()
                .find_map(|line| line.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
        })
        .sum()
}

/// The raw reply of `INFO section` from the server on `port` (empty if it
/// does not answer).
pub(crate) fn info(port: u16, section: &str) -> String {
    test_support::command(port, &["INFO", section]).unwrap_or_default()
}

/// A numeric field (`name:` included) of an INFO reply; 0 when absent.
fn info_field(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}
