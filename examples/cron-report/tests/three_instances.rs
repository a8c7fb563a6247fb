//! Three instances fire the same job every second; each tick runs in exactly
//! one of them. A tick is the second a scheduler fires in: an instance
//! prints `fired <tick>` when it fires, `done <tick>` when its `report`
//! returned (ran, or skipped a busy lock). Every tick some instance fired
//! for ran exactly once, in one of those instances; a tick none fired for
//! (every scheduler late that second, on a loaded machine) ran nowhere.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use test_support::{Process, RedisServer};

const NAMES: [&str; 3] = ["a", "b", "c"];
const TICKS: u64 = 4;
/// Generous bound for an instance's next line (it prints every second).
const LINE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The ticks from `first` to `last` that `instance` fired for, read from
/// its lines until it fired for a later tick (it fires in order) and was
/// done with each of them (so its run, if any, is recorded).
fn fired(instance: &mut Process, first: u64, last: u64) -> BTreeSet<u64> {
    let tick = |line: &str, prefix: &str| -> Option<u64> {
        line.strip_prefix(prefix)
            .map(|tick| tick.parse().unwrap_or_else(|_| panic!("{line:?}")))
    };
    let (mut fired, mut done) = (BTreeSet::new(), BTreeSet::new());
    let mut past = false;
    while !(past && fired.is_subset(&done)) {
        let line = instance.line(LINE_TIMEOUT);
        if let Some(tick) = tick(&line, "fired ") {
            if tick > last {
                past = true;
            } else if tick >= first {
                fired.insert(tick);
            }
        } else if let Some(tick) = tick(&line, "done ") {
            done.insert(tick);
        }
    }
    fired
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
    let last = first + TICKS - 1;
    // Which instances fired for each tick.
    let mut firers: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for (instance, name) in instances.iter_mut().zip(NAMES) {
        for tick in fired(instance, first, last) {
            firers.entry(tick).or_default().push(name);
        }
    }

    for tick in first..=last {
        let runs = redis
            .command(&["LRANGE", &format!("runs:{tick}"), "0", "-1"])
            .unwrap();
        let ran: Vec<&str> = runs
            .split("\r\n")
            .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
            .collect();
        match firers.get(&tick) {
            Some(fired) => {
                assert_eq!(
                    ran.len(),
                    1,
                    "tick {tick}, fired by {fired:?}, should have run exactly once: {ran:?}"
                );
                assert!(
                    fired.contains(&ran[0]),
                    "tick {tick} ran in {ran:?}, which did not fire for it ({fired:?} did)"
                );
            }
            None => assert!(ran.is_empty(), "tick {tick} ran unfired: {ran:?}"),
        }
    }
    // The lock had something to decide: ticks that several instances fired
    // for (normally all three, every tick).
    let contended = firers.values().filter(|fired| fired.len() > 1).count();
    assert!(
        contended >= 2,
        "only {contended} of the ticks {first}..={last} were fired for by several instances: \
         {firers:?}"
    );
}
