//! `lock-bench`: benchmarks that start their own redis-server on loopback
//! and print figures. Not part of the test run (CI only builds it).
//!
//! ```text
//! cargo run --release -p lock-bench -- renewal [--locks 1000,10000] [--seconds 60] [--ttl-ms 1000]
//! cargo run --release -p lock-bench -- compare [--scale 1.0] [--no-write] [--server valkey] [--only w1,w2,w3,w4,w5,w6,w7] [--kinds manual,handwritten]
//! cargo run --release -p lock-bench -- cluster [--scale 0.25] [--seconds 10] [--locks 10000]
//! cargo run --release -p lock-bench -- acknowledged [--pairs 5000] [--renewed 1000]
//! cargo run --release -p lock-bench -- multi [--seconds 3]
//! cargo run --release -p lock-bench -- redlock [--nodes 5] [--pairs 2000] [--sections 500] [--only w1,w2,w3] [--kinds ours,rslock]
//! cargo run --release -p lock-bench -- redlock-degraded [--seconds 5] [--processes 3] [--tasks 3]
//! cargo run --release -p lock-bench -- sentinel [--pairs 20000] [--rounds 20]
//! cargo run --release -p lock-bench -- redlock-shared [--pairs 2000]
//! cargo run --release -p lock-bench -- scale [--processes 64] [--tasks 4] [--seconds 3]
//! ```
//!
//! `redlock-degraded` runs copies of this binary as its contenders, in the
//! hidden mode `redlock-contender`; `scale` as its workers, in `scale-worker`.

mod acknowledged;
mod cluster;
mod compare;
mod cpu_time;
mod implementations;
mod multi;
mod process_usage;
mod redlock;
mod redlock_degraded;
mod redlock_shared;
mod renewal;
mod scale;
mod sentinel;
mod target;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("renewal") => renewal::main(&args[1..]),
        Some("compare") => compare::main(&args[1..]),
        Some("cluster") => cluster::main(&args[1..]),
        Some("acknowledged") => acknowledged::main(&args[1..]),
        Some("multi") => multi::main(&args[1..]),
        Some("redlock") => redlock::main(&args[1..]),
        Some("redlock-degraded") => redlock_degraded::main(&args[1..]),
        Some("redlock-shared") => redlock_shared::main(&args[1..]),
        Some("redlock-contender") => redlock_degraded::contender(&args[1..]),
        Some("sentinel") => sentinel::main(&args[1..]),
        Some("scale") => scale::main(&args[1..]),
        Some("scale-worker") => scale::worker(&args[1..]),
        _ => {
            eprintln!(
                "usage: lock-bench renewal [--locks 1000,10000] [--seconds 60] [--ttl-ms 1000]\n       \
                 lock-bench compare [--scale 1.0] [--no-write] [--server valkey] [--only w1,w2,w3,w4,w5,w6,w7] [--kinds manual,handwritten]\n       \
                 lock-bench cluster [--scale 0.25] [--seconds 10] [--locks 10000]\n       \
                 lock-bench acknowledged [--pairs 5000] [--renewed 1000]\n       \
                 lock-bench multi [--seconds 3]\n       \
                 lock-bench redlock [--nodes 5] [--pairs 2000] [--sections 500] [--only w1,w2,w3] [--kinds ours,rslock]\n       \
                 lock-bench redlock-degraded [--seconds 5] [--processes 3] [--tasks 3]\n       \
                 lock-bench redlock-shared [--pairs 2000]\n       \
                 lock-bench sentinel [--pairs 20000] [--rounds 20]\n       \
                 lock-bench scale [--processes 64] [--tasks 4] [--seconds 3]"
            );
            ExitCode::FAILURE
        }
    }
}

/// The value after `--name`, if given.
pub(crate) fn option(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1).cloned())
}
