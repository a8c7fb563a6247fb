//! Three processes of the example make random transfers between 8 accounts
//! at once (4 tasks each); every transfer succeeds and the total is exact.

use std::time::Duration;

use test_support::{Process, RedisServer};

const ACCOUNTS: &str = "8";
/// Generous bound for a process's line (each finishes in about a second).
const LINE_TIMEOUT: Duration = Duration::from_secs(300);

fn run(redis: &RedisServer, args: &[&str]) -> Process {
    Process::spawn(env!("CARGO_BIN_EXE_transfer"), args, Some(&redis.url()))
}

#[test]
fn transfers_from_three_processes_keep_the_total() {
    let redis = RedisServer::start();
    assert_eq!(run(&redis, &["init", ACCOUNTS]).line(LINE_TIMEOUT), "ready");
    let mut processes: Vec<Process> = ["1", "2", "3"]
        .iter()
        .map(|seed| run(&redis, &["run", ACCOUNTS, "400", seed]))
        .collect();
    for process in &mut processes {
        assert_eq!(process.line(LINE_TIMEOUT), "done 400 0");
    }
    assert_eq!(run(&redis, &["total", ACCOUNTS]).line(LINE_TIMEOUT), "8000");
}
