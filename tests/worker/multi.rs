//! The worker's modes for several keys at once (`Lock::all`, `key = [..]`).
//!
//! - `multi-rounds ROUNDS TASKS NAME...`: takes and releases a set of its
//!   own (connections opened, scripts loaded), prints `ready`, waits for
//!   `go`, then TASKS tasks each take the set NAME... (given in this order;
//!   ttl 10 s, wait 60 s) ROUNDS times. Inside, it INCRs `multi:inside` on
//!   the bookkeeping server (a value other than 1 INCRs `multi:overlaps`),
//!   RPUSHes its pid to `multi:order`, yields, DECRs. Prints `done
//!   rounds=N errors=E longest_ms=M` (M: the longest acquire) and, after
//!   `|`, the first error.
//! - `transfer ACCOUNTS ROUNDS SEED`: prints `ready` (as above), waits for
//!   `go`, then makes ROUNDS random transfers between `balance:<i>` keys
//!   (i < ACCOUNTS) on the bookkeeping server, each under the attribute's
//!   `key = ["account:<from>", "account:<to>"]` (a non-atomic GET, GET,
//!   SET, SET; `from == to` is one lock and moves nothing). Prints `done
//!   transfers=N errors=E`.
//! - `stream KEY`: a single-key locker beside sets: takes `Lock::new(KEY)`
//!   (ttl 10 s, wait 10 s) again and again, each a 2 ms section that then
//!   INCRs `stream:sections` on the bookkeeping server, asking again as
//!   soon as it released. Prints `ready` after its first section, and
//!   `done sections=N errors=E` once `stop` arrives on stdin.

use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, Lock, LockError};
use redis::AsyncCommands;

use crate::{bookkeeping, next_line, say, Redis};

pub(crate) async fn multi_rounds(rounds: u32, tasks: u32, names: &[&str]) {
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    warm().await;
    say("ready");
    assert_eq!(next_line().await, "go");
    let runs = (0..tasks).map(|_| {
        let names = names.clone();
        tokio::spawn(async move { rounds_of(rounds, &names).await })
    });
    let (mut done, mut errors, mut longest, mut first) = (0, 0, Duration::ZERO, None);
    for run in runs.collect::<Vec<_>>() {
        let (ran, failed, slowest, error) = run.await.unwrap();
        done += ran;
        errors += failed;
        longest = longest.max(slowest);
        first = first.or(error);
    }
    say(&format!(
        "done rounds={done} errors={errors} longest_ms={}|{}",
        longest.as_millis(),
        first.unwrap_or_default()
    ));
}

async fn rounds_of(rounds: u32, names: &[String]) -> (u32, u32, Duration, Option<String>) {
    let mut redis = bookkeeping().await;
    let set = Lock::all(names.iter().cloned())
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let pid = std::process::id();
    let (mut done, mut errors, mut longest, mut first) = (0, 0, Duration::ZERO, None);
    for _ in 0..rounds {
        let asked = Instant::now();
        let guard = match set.acquire().await {
            Ok(guard) => guard,
            Err(error) => {
                errors += 1;
                first.get_or_insert_with(|| error.to_string());
                continue;
            }
        };
        longest = longest.max(asked.elapsed());
        let inside: i64 = redis.incr("multi:inside", 1).await.unwrap();
        if inside != 1 {
            let _: i64 = redis.incr("multi:overlaps", 1).await.unwrap();
        }
        let _: i64 = redis.rpush("multi:order", pid).await.unwrap();
        tokio::task::yield_now().await;
        let _: i64 = redis.decr("multi:inside", 1).await.unwrap();
        match guard.release().await {
            Ok(()) => done += 1,
            Err(error) => {
                errors += 1;
                first.get_or_insert_with(|| error.to_string());
            }
        }
    }
    (done, errors, longest, first)
}

/// Opens the client's connections and loads the set script: a set of this
/// process's own, taken and released.
async fn warm() {
    let own = format!("warm:{}", std::process::id());
    let set = Lock::all([format!("{own}:a"), format!("{own}:b")]);
    // A fresh client on a loaded machine may miss its first majority over
    // a quorum (its connections still opening): tried again for a while
    // (`Busy` while the failed attempt's grant on a node is given back).
    let deadline = Instant::now() + Duration::from_secs(30);
    let guard = loop {
        match set.try_acquire().await {
            Ok(guard) => break guard,
            Err(LockError::Redis { .. } | LockError::Busy { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("warm: a free set: {error:?}"),
        }
    };
    guard.release().await.expect("warm: release");
}

#[distributed_lock(key = ["account:<from>", "account:<to>"], ttl = "10s", wait = "60s")]
async fn transfer(redis: &mut Redis, from: u32, to: u32, cents: i64) -> Result<(), LockError> {
    if from == to {
        return Ok(());
    }
    let (from_key, to_key) = (format!("balance:{from}"), format!("balance:{to}"));
    let from_balance: i64 = redis.get(&from_key).await.unwrap();
    let to_balance: i64 = redis.get(&to_key).await.unwrap();
    // Give other transfers every chance to interleave.
    tokio::task::yield_now().await;
    let _: () = redis.set(&from_key, from_balance - cents).await.unwrap();
    let _: () = redis.set(&to_key, to_balance + cents).await.unwrap();
    Ok(())
}

pub(crate) async fn transfers(accounts: u32, rounds: u32, seed: u64) {
    warm().await;
    let mut redis = bookkeeping().await;
    say("ready");
    assert_eq!(next_line().await, "go");
    // xorshift: deterministic per seed, no dependency.
    let mut state = seed.max(1);
    let mut next = move |below: u32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % u64::from(below)) as u32
    };
    let (mut done, mut errors, mut first) = (0, 0, None);
    for _ in 0..rounds {
        let (from, to, cents) = (next(accounts), next(accounts), i64::from(next(100)) + 1);
        match transfer(&mut redis, from, to, cents).await {
            Ok(()) => done += 1,
            Err(error) => {
                errors += 1;
                first.get_or_insert_with(|| error.to_string());
            }
        }
    }
    say(&format!(
        "done transfers={done} errors={errors}|{}",
        first.unwrap_or_default()
    ));
}

pub(crate) async fn stream(key: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut redis = bookkeeping().await;
    let lock = Lock::new(key)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(10));
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let told = tokio::spawn(async move {
        assert_eq!(next_line().await, "stop");
        stopping.store(true, Ordering::Relaxed);
    });
    let (mut sections, mut errors) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        match lock.acquire().await {
            Ok(guard) => {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let _: i64 = redis.incr("stream:sections", 1).await.unwrap();
                if guard.release().await.is_err() {
                    errors += 1;
                }
                sections += 1;
                if sections == 1 {
                    say("ready");
                }
            }
            Err(_) => errors += 1,
        }
    }
    told.await.unwrap();
    say(&format!("done sections={sections} errors={errors}"));
}
