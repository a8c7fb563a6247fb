//! Mutual exclusion across OS processes: 4 processes x 8 tasks contend for
//! one key with `wait`; every critical section is a non-atomic GET / +1 / SET.

mod common;
use common::*;

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const SECTIONS: usize = 10;

fn run_workers(server: &RedisServer, counter: &str, extra: &[&str]) -> i64 {
    let (tasks, sections) = (TASKS.to_string(), SECTIONS.to_string());
    let mut args = vec!["count", "shared-counter", &tasks, &sections, counter];
    args.extend_from_slice(extra);
    let mut workers: Vec<Process> = (0..PROCESSES).map(|_| worker(server, &args)).collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT * 4), "done");
    }
    value(&redis(server, &["GET", counter]))
        .expect("counter exists")
        .parse()
        .unwrap()
}

#[test]
fn no_update_is_lost_under_the_lock() {
    let server = RedisServer::start();
    let total = run_workers(&server, "counter:locked", &[]);
    assert_eq!(total, (PROCESSES * TASKS * SECTIONS) as i64);
    // Fencing tokens, in the order the bodies ran, only ever go up.
    let fences = redis(&server, &["LRANGE", "counter:locked:fences", "0", "-1"]);
    let fences: Vec<u64> = fences
        .split("\r\n")
        .skip(1)
        .filter(|line| !line.starts_with('$') && !line.is_empty())
        .map(|token| token.parse().unwrap())
        .collect();
    assert_eq!(fences.len(), PROCESSES * TASKS * SECTIONS);
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens went backwards: {fences:?}"
    );
    assert_eq!(
        redis(&server, &["EXISTS", "lock:{shared-counter}"]),
        ":0\r\n"
    );
}

/// The control: the same sections without the lock lose updates, so the test
/// above would catch a lock that does not exclude.
#[test]
fn updates_are_lost_without_the_lock() {
    let server = RedisServer::start();
    let total = run_workers(&server, "counter:unlocked", &["unlocked"]);
    assert!(
        total < (PROCESSES * TASKS * SECTIONS) as i64,
        "expected lost updates without the lock, got {total}"
    );
}
