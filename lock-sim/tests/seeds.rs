//! The simulation in the test command: a fixed set of seeds over every
//! scenario (each failure prints the line that replays it), and one seed run
//! twice with the same history.

/// Seeds per scenario in the test command (about a minute on a loaded
/// 2-core machine in the test profile); `LOCK_SIM_SEEDS` overrides it.
const SEEDS: u64 = 12;

fn seeds() -> u64 {
    std::env::var("LOCK_SIM_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(SEEDS)
}

/// Seeds of long runs that found a violation since fixed, replayed in the
/// test command so that the fix stays (design §17 tells each one).
const FOUND: &[(&str, u64)] = &[
    // A fenced set learned of a switch from its fencing write-back's
    // `MOVED` and was handed out with a key the new primary lacked.
    ("cluster", 30151),
];

fn check(runs: impl IntoIterator<Item = (&'static str, u64)>) {
    let mut failures = Vec::new();
    for (name, seed) in runs {
        let report = lock_sim::run(name, seed);
        if !report.violations.is_empty() {
            let mut text = format!("seed {seed} scenario {name}:\n");
            for violation in &report.violations {
                text.push_str(&format!("  {}: {}\n", violation.kind, violation.text));
            }
            text.push_str(&format!("  replay: {}\n", report.replay_line()));
            failures.push(text);
        }
    }
    assert!(failures.is_empty(), "violations:\n{}", failures.concat());
}

fn scenario(name: &'static str) {
    check((1..=seeds()).map(|seed| (name, seed)));
}

#[test]
fn seeds_that_found_a_violation_run_clean() {
    check(FOUND.iter().copied());
}

#[test]
fn node() {
    scenario("node");
}

#[test]
fn sentinel() {
    scenario("sentinel");
}

#[test]
fn cluster() {
    scenario("cluster");
}

#[test]
fn quorum3() {
    scenario("quorum3");
}

#[test]
fn quorum5() {
    scenario("quorum5");
}

/// The same seed gives the same history, byte for byte: a run is a
/// function of its seed (every scenario, one seed each).
#[test]
fn a_seed_replays_the_same_history() {
    for name in lock_sim::SCENARIOS {
        let first = lock_sim::run(name, 7);
        let second = lock_sim::run(name, 7);
        assert!(
            first.calls > 50,
            "{name}: a run makes calls ({})",
            first.calls
        );
        if first.history != second.history {
            let diff = first
                .history
                .lines()
                .zip(second.history.lines())
                .find(|(a, b)| a != b)
                .map(|(a, b)| format!("first:  {a}\nsecond: {b}"))
                .unwrap_or_else(|| "one history is longer".to_owned());
            panic!("{name}: seed 7 gave two histories; first difference:\n{diff}");
        }
    }
}
