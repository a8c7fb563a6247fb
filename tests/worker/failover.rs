//! The worker modes of the failover tests (`tests/sentinel.rs`): sections
//! that go on through errors (a failover makes some calls fail) and a
//! renewed holder that says when it loses its lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{distributed_lock, Lock, LockError};
use redis::AsyncCommands;

use crate::{bookkeeping, next_line, say, Redis};

/// One section under the attribute (renewed, fenced): INCRs
/// `COUNTER:inside` on the bookkeeping server and counts an overlap in
/// `COUNTER:overlaps` when another holder is inside; appends the
/// bookkeeping server's clock (µs) to `COUNTER:starts` and the fencing
/// token to `COUNTER:fences`; stays 5 ms; DECRs.
#[distributed_lock(key = "<key>", ttl = "10s", wait = "60s", renew, fencing)]
async fn failover_section(key: &str, redis: &mut Redis, counter: &str) -> Result<(), LockError> {
    let inside: i64 = redis.incr(format!("{counter}:inside"), 1).await.unwrap();
    if inside != 1 {
        let _: i64 = redis.incr(format!("{counter}:overlaps"), 1).await.unwrap();
    }
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(redis).await.unwrap();
    let fence = lock_runtime::current()
        .and_then(|held| held.fencing_token())
        .expect("taken with fencing");
    let _: i64 = redis
        .rpush(format!("{counter}:starts"), seconds * 1_000_000 + micros)
        .await
        .unwrap();
    let _: i64 = redis
        .rpush(format!("{counter}:fences"), fence)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _: i64 = redis.decr(format!("{counter}:inside"), 1).await.unwrap();
    Ok(())
}

/// `failover-sections KEY TASKS COUNTER`: TASKS tasks run
/// [`failover_section`] again and again until `stop` arrives on stdin (see
/// [`sections`]).
pub async fn failover_sections(key: &str, tasks: usize, counter: &str) {
    sections(key, tasks, counter, Section::Failover).await
}

/// Which section [`sections`] runs.
#[derive(Clone, Copy)]
enum Section {
    Failover,
    Switch,
}

/// TASKS tasks run `section` again and again until `stop` arrives on
/// stdin; a call that fails (the primary is gone, the lock was lost) is
/// counted and tried again 20 ms later. Prints `ready` once this process
/// ran a section, then `done ran=N errors=E|FIRST` (FIRST: the first
/// error).
async fn sections(key: &str, tasks: usize, counter: &str, section: Section) {
    let stop = Arc::new(AtomicBool::new(false));
    let (ran_tx, mut ran_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (key, counter, stop) = (key.to_owned(), counter.to_owned(), Arc::clone(&stop));
        let ran_tx = ran_tx.clone();
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            let (mut ran, mut errors) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let result = match section {
                    Section::Failover => failover_section(&key, &mut redis, &counter).await,
                    Section::Switch => switch_section(&key, &mut redis, &counter).await,
                };
                match result {
                    Ok(()) => {
                        ran += 1;
                        let _ = ran_tx.send(());
                    }
                    Err(error) => {
                        errors.push(error.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ran, errors)
        }));
    }
    drop(ran_tx);
    ran_rx.recv().await.expect("a section ran");
    say("ready");
    assert_eq!(next_line().await, "stop");
    stop.store(true, Ordering::Relaxed);
    let (mut ran, mut errors) = (0, Vec::new());
    for handle in handles {
        let (task_ran, task_errors) = handle.await.unwrap();
        ran += task_ran;
        errors.extend(task_errors);
    }
    let first = errors.first().cloned().unwrap_or_default();
    say(&format!("done ran={ran} errors={}|{first}", errors.len()));
}

/// `hold-renewed KEY TTL_MS`: takes the lock (renewed, ttl TTL_MS), prints
/// `held TOKEN`; then prints `lost CAUSE` as soon as it is lost, or, on
/// `release` from stdin, releases and prints `released` (or `lost CAUSE`,
/// `error: MESSAGE`).
pub async fn hold_renewed(key: &str, ttl_ms: u64) {
    let guard = Lock::new(key)
        .ttl(Duration::from_millis(ttl_ms))
        .renew()
        .acquire()
        .await
        .expect("hold-renewed: acquire");
    say(&format!("held {}", guard.token()));
    tokio::select! {
        cause = guard.lost() => say(&format!("lost {cause:?}")),
        line = next_line() => {
            assert_eq!(line, "release");
            match guard.release().await {
                Ok(()) => say("released"),
                Err(LockError::Lost { cause, .. }) => say(&format!("lost {cause:?}")),
                Err(error) => say(&format!("error: {error}")),
            }
        }
    }
}

/// With `LOCK_ACKNOWLEDGED=N` set, the process-wide client is made from
/// `REDIS_URL` in acknowledged mode: N replicas within 1 s (a 5 s
/// response timeout).
pub fn init_acknowledged() {
    let Ok(replicas) = std::env::var("LOCK_ACKNOWLEDGED") else {
        return;
    };
    let url = std::env::var("REDIS_URL").expect("REDIS_URL is set by the test");
    lock_runtime::init_with(
        lock_runtime::Config::new(url)
            .response_timeout(Duration::from_secs(5))
            .acknowledged(replicas.parse().unwrap(), Duration::from_secs(1)),
    )
    .expect("an acknowledged client");
}

/// Records one section on the bookkeeping server: `SET COUNTER value` and
/// `RPUSH COUNTER:sections "START END ID"` (END: the server's clock now,
/// µs; ID: the section's, unique) in one script, so that a section counts
/// in the list exactly when its write of the counter happened.
const RECORD_SECTION: &str = "local t = redis.call('TIME') \
    redis.call('SET', KEYS[1], ARGV[1]) \
    redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. t[1] .. string.format('%06d', tonumber(t[2])) \
        .. ' ' .. ARGV[3]) \
    return 1";

/// A section's id: this process's id and its number here.
fn section_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The bookkeeping server's clock, µs.
async fn now_us(redis: &mut Redis) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(redis).await.unwrap();
    seconds * 1_000_000 + micros
}

/// A section stopped before it knew it had recorded itself (its lock was
/// lost and the attribute stopped the body; the record may have been made
/// while its reply was on its way): `RPUSH COUNTER:cancelled "START END
/// ID"` (END: when it was stopped), from a task of its own.
struct Unfinished {
    redis: Option<Redis>,
    counter: String,
    start: u64,
    id: String,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(mut redis) = self.redis.take() {
            let (counter, start, id) = (self.counter.clone(), self.start, self.id.clone());
            tokio::spawn(async move {
                let end = now_us(&mut redis).await;
                let _: i64 = redis
                    .rpush(
                        format!("{counter}:cancelled"),
                        format!("{start} {end} {id}"),
                    )
                    .await
                    .unwrap();
            });
        }
    }
}

/// One section as the issue-38 scenario has it (`ttl = "10s"`, `wait =
/// "15s"`, renewed): a non-atomic GET / +1 / SET of COUNTER with 5 ms in
/// between, recorded with its start and end (the bookkeeping server's
/// clock) in `COUNTER:sections`, or in `COUNTER:cancelled` if it was
/// stopped first.
#[distributed_lock(key = "<key>", ttl = "10s", wait = "15s", renew)]
async fn switch_section(key: &str, redis: &mut Redis, counter: &str) -> Result<(), LockError> {
    let start = now_us(redis).await;
    let mut unfinished = Unfinished {
        redis: Some(redis.clone()),
        counter: counter.to_owned(),
        start,
        id: section_id(),
    };
    let value: i64 = redis
        .get::<_, Option<i64>>(counter)
        .await
        .unwrap()
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _: i64 = redis::cmd("EVAL")
        .arg(RECORD_SECTION)
        .arg(2)
        .arg(counter)
        .arg(format!("{counter}:sections"))
        .arg(value + 1)
        .arg(start)
        .arg(&unfinished.id)
        .query_async(redis)
        .await
        .unwrap();
    unfinished.redis = None;
    Ok(())
}

/// `switch-sections KEY TASKS COUNTER`: TASKS tasks run [`switch_section`]
/// again and again until `stop` arrives on stdin (see [`sections`]).
pub async fn switch_sections(key: &str, tasks: usize, counter: &str) {
    sections(key, tasks, counter, Section::Switch).await
}

/// `holder`: takes commands on stdin, one per line, and answers each with
/// one line:
/// - `try KEY TTL_MS`: one try (no renewal); `acquired`, `busy`, or
///   `error: KIND: MESSAGE` (KIND: `not-replicated` or `other`); the lock
///   is kept until `release KEY`;
/// - `release KEY`: `released`, `lost CAUSE` or `error: MESSAGE`;
/// - `held KEY`: `held` while the lock is held as far as the holder knows,
///   else `not held`.
pub async fn holder() {
    let mut held: std::collections::HashMap<String, lock_runtime::LockGuard> =
        std::collections::HashMap::new();
    loop {
        let line = next_line().await;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["try", key, ttl_ms] => {
                let ttl = Duration::from_millis(crate::parse(ttl_ms));
                match Lock::new(*key).ttl(ttl).try_acquire().await {
                    Ok(guard) => {
                        held.insert((*key).to_owned(), guard);
                        say("acquired");
                    }
                    Err(LockError::Busy { .. }) => say("busy"),
                    Err(error @ LockError::NotReplicated { .. }) => {
                        say(&format!("error: not-replicated: {error}"))
                    }
                    Err(error) => say(&format!("error: other: {error}")),
                }
            }
            ["release", key] => match held.remove(*key) {
                Some(guard) => match guard.release().await {
                    Ok(()) => say("released"),
                    Err(LockError::Lost { cause, .. }) => say(&format!("lost {cause:?}")),
                    Err(error) => say(&format!("error: {error}")),
                },
                None => say("error: not held"),
            },
            ["held", key] => match held.get(*key) {
                Some(guard) if guard.is_held() => say("held"),
                _ => say("not held"),
            },
            [] => return,
            _ => panic!("holder: unknown command {line:?}"),
        }
    }
}

/// `pass-on KEY`: one task takes KEY (ttl 30 s, not renewed, fenced) and says
/// `held TOKEN`. On `pass`, a second task of the process asks for KEY
/// (waiting; it queues in the process at its first poll) and the first
/// releases: the second says `passed TOKEN` when the lock went to it in
/// the process (the hand-off counter moved), else `not passed`. Then, one
/// per line: `touch NAME` tries NAME once (a call of the process:
/// `touched`); `held`: `held` or `not held` for the second task's lock.
pub async fn pass_on(key: &str) {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("a metrics recorder");
    let handoffs = || -> u64 {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "distributed_lock_handoffs_total")
            .map(|(.., value)| match value {
                DebugValue::Counter(count) => count,
                _ => 0,
            })
            .sum()
    };
    let token = || async { lock_runtime::current().map(|lock| lock.token().to_owned()) };
    let ttl = Duration::from_secs(30);
    // Waiting and fenced: taken as the process's queue's first (a lock
    // taken by a plain `SET` has no queue in the process to pass it to).
    let first = Lock::new(key)
        .ttl(ttl)
        .wait(Duration::from_secs(20))
        .fencing()
        .acquire()
        .await
        .expect("the lock");
    say(&format!(
        "held {}",
        first.run(token()).await.unwrap().unwrap()
    ));
    assert_eq!(next_line().await, "pass");
    let waiter = Lock::new(key).ttl(ttl).wait(Duration::from_secs(20));
    let mut second = Box::pin(waiter.acquire());
    tokio::select! {
        biased;
        _ = &mut second => panic!("the second task got the lock while the first held it"),
        _ = std::future::ready(()) => {}
    }
    let before = handoffs();
    first.release().await.expect("the first task's release");
    let second = second.await.expect("the second task's lock");
    if handoffs() == before {
        say("not passed");
        return;
    }
    say(&format!(
        "passed {}",
        second.run(token()).await.unwrap().unwrap()
    ));
    loop {
        let line = next_line().await;
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["touch", name] => {
                let _ = Lock::new(*name).try_acquire().await;
                say("touched");
            }
            ["held"] => say(if second.is_held() { "held" } else { "not held" }),
            [] => return,
            _ => panic!("pass-on: unknown command {line:?}"),
        }
    }
}
