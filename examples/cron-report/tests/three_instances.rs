//! Three instances fire the same job every second; each tick runs in exactly
//! one of them.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use test_support::{Process, RedisServer};

const NAMES: [&str; 3] = ["a", "b", "c"];
const TICKS: u64 = 4;

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits (bounded) for the instance to say its scheduler runs.
fn wait_started(instance: &mut Process, name: &str) {
    let expected = format!("started {name}");
    for _ in 0..10 {
        if instance.line(Duration::from_secs(10)) == expected {
            return;
        }
    }
    panic!("instance {name} did not print `{expected}`");
}

fn llen(redis: &RedisServer, key: &str) -> u64 {
    let reply = redis.command(&["LLEN", key]).unwrap();
    reply
        .strip_prefix(':')
        .and_then(|n| n.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("LLEN {key}: {reply:?}"))
}

#[test]
fn each_tick_runs_in_exactly_one_instance() {
    let redis = RedisServer::start();
    let mut instances: Vec<Process> = NAMES
        .iter()
        .map(|name| {
            Process::spawn(
                env!("CARGO_BIN_EXE_cron-report"),
                &[name],
                Some(&redis.url()),
            )
        })
        .collect();
    for (instance, name) in instances.iter_mut().zip(NAMES) {
        wait_started(instance, name);
    }

    // The first tick that starts after all three are up, and the next ones.
    let first = unix_millis() / 1000 + 1;
    let ticks: Vec<u64> = (first..first + TICKS).collect();

    // Wait until the last tick has ended, plus a second for the late firings
    // (a scheduler fires up to 500 ms into its second).
    let checked_at = (first + TICKS + 1) * 1000;
    std::thread::sleep(Duration::from_millis(
        checked_at.saturating_sub(unix_millis()),
    ));

    let deadline = Instant::now() + Duration::from_secs(5);
    for tick in ticks {
        let key = format!("runs:{tick}");
        while llen(&redis, &key) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let runs = redis.command(&["LRANGE", &key, "0", "-1"]).unwrap();
        assert_eq!(
            llen(&redis, &key),
            1,
            "tick {tick} should have run exactly once: {runs:?}"
        );
        assert!(
            NAMES
                .iter()
                .any(|name| runs.ends_with(&format!("\r\n{name}\r\n"))),
            "tick {tick} ran in an unknown instance: {runs:?}"
        );
    }
}
