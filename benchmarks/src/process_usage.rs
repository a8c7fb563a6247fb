//! Resident memory and CPU time of this process, and Redis's CPU time.

use std::time::Duration;

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

/// User + system CPU time used by this process so far.
pub(crate) fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| {
        Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64)
    };
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// used_cpu_sys + used_cpu_user of the Redis server, from INFO cpu.
pub(crate) fn redis_cpu(server: &test_support::RedisServer) -> Duration {
    let info = server.command(&["INFO", "cpu"]).unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_sys:") + field("used_cpu_user:"))
}

/// Reads Redis has done from its clients' sockets (INFO stats): divided into
/// the commands, how well clients batch their requests.
pub(crate) fn redis_reads(server: &test_support::RedisServer) -> u64 {
    let info = server.command(&["INFO", "stats"]).unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("total_reads_processed:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}
