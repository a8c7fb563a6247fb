//! This process's CPU time: shared by lock-bench and its other binaries
//! (`outside`, `wire_floor`, which include this file by path).

use std::time::Duration;

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
