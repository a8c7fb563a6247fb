//! `lock-sim`: runs the simulation from the command line.
//!
//! ```text
//! lock-sim replay --seed 1234 --scenario quorum3   # one run, its history
//! lock-sim run --scenario all --seconds 600        # seeds until time is up
//! lock-sim run --scenario node --seeds 1000 --first 1
//! ```

use std::time::{Duration, Instant};

fn usage() -> ! {
    eprintln!(
        "usage: lock-sim replay --seed N --scenario NAME [--trace]\n       lock-sim run [--scenario NAME|all] [--seconds S] [--seeds N] [--first SEED]\n       lock-sim hunt --scenario NAME[,NAME...] [--kinds KIND,...] [--seeds N] [--first SEED]\nscenarios: {}",
        lock_sim::SCENARIOS.join(", ")
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else { usage() };
    let value = |name: &str| -> Option<String> {
        args.iter()
            .position(|arg| arg == name)
            .and_then(|at| args.get(at + 1).cloned())
    };
    match command.as_str() {
        "replay" => {
            let seed: u64 = value("--seed")
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| usage());
            let scenario = value("--scenario").unwrap_or_else(|| usage());
            if lock_sim::backend(&scenario).is_none() {
                usage();
            }
            let report =
                lock_sim::run_traced(&scenario, seed, args.iter().any(|arg| arg == "--trace"));
            print!("{}", report.history);
            if report.violations.is_empty() {
                println!("seed {seed} scenario {scenario}: no violation");
            } else {
                for violation in &report.violations {
                    println!("VIOLATION {}: {}", violation.kind, violation.text);
                }
                std::process::exit(1);
            }
        }
        "run" => {
            let scenario = value("--scenario").unwrap_or_else(|| "all".into());
            let scenarios: Vec<String> = if scenario == "all" {
                lock_sim::SCENARIOS.iter().map(|s| s.to_string()).collect()
            } else if lock_sim::backend(&scenario).is_some() {
                vec![scenario]
            } else {
                usage()
            };
            let seconds: Option<u64> = value("--seconds").and_then(|s| s.parse().ok());
            let seeds: Option<u64> = value("--seeds").and_then(|s| s.parse().ok());
            let first: u64 = value("--first").and_then(|s| s.parse().ok()).unwrap_or(1);
            let limit = Duration::from_secs(seconds.unwrap_or(if seeds.is_some() {
                u64::MAX / 4
            } else {
                60
            }));
            let started = Instant::now();
            let (mut runs, mut failed, mut virtual_us, mut calls) = (0u64, 0u64, 0i64, 0usize);
            let mut seed = first;
            'outer: loop {
                for scenario in &scenarios {
                    if started.elapsed() >= limit || seeds.is_some_and(|n| seed >= first + n) {
                        break 'outer;
                    }
                    let report = lock_sim::run(scenario, seed);
                    runs += 1;
                    virtual_us += report.virtual_us;
                    calls += report.calls;
                    if !report.violations.is_empty() {
                        failed += 1;
                        println!(
                            "FAILED seed {seed} scenario {scenario}{}: {} violation(s)",
                            match lock_sim::run_kind(scenario, seed) {
                                lock_sim::RunKind::Contended => " (contention run)",
                                lock_sim::RunKind::Switching => " (switching run)",
                                lock_sim::RunKind::Mixed => "",
                            },
                            report.violations.len()
                        );
                        for violation in report.violations.iter().take(3) {
                            println!("  {}: {}", violation.kind, violation.text);
                        }
                        println!("  replay: {}", report.replay_line());
                    }
                }
                seed += 1;
            }
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "{runs} runs ({} seeds x {} scenarios), {failed} with violations, {calls} calls, {:.0} s of virtual time, in {elapsed:.1} s: {:.2} runs/s",
                seed - first,
                scenarios.len(),
                virtual_us as f64 / 1e6,
                runs as f64 / elapsed
            );
            if failed > 0 {
                std::process::exit(1);
            }
        }
        "hunt" => {
            // Seeds from --first until the first violation (mutants/hunt.sh).
            let scenario = value("--scenario").unwrap_or_else(|| usage());
            let scenarios: Vec<String> = scenario.split(',').map(str::to_owned).collect();
            if scenarios.iter().any(|s| lock_sim::backend(s).is_none()) {
                usage();
            }
            let seeds: u64 = value("--seeds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1000);
            let first: u64 = value("--first").and_then(|s| s.parse().ok()).unwrap_or(1);
            // Only violations of these kinds count (a hole's own), if given.
            let kinds: Vec<String> = value("--kinds")
                .map(|kinds| kinds.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            let started = Instant::now();
            let mut runs = 0u64;
            for seed in first..first + seeds {
                for scenario in &scenarios {
                    runs += 1;
                    let report = lock_sim::run(scenario, seed);
                    if let Some(violation) = report.violations.iter().find(|violation| {
                        kinds.is_empty() || kinds.iter().any(|kind| kind == violation.kind)
                    }) {
                        println!(
                            "FOUND after {runs} runs (seed {seed}, scenario {scenario}) in {:.1} s: {}: {}",
                            started.elapsed().as_secs_f64(),
                            violation.kind,
                            violation.text
                        );
                        println!("replay: {}", report.replay_line());
                        return;
                    }
                }
            }
            println!(
                "NOT FOUND in {runs} runs ({seeds} seeds) in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            std::process::exit(1);
        }
        _ => usage(),
    }
}
