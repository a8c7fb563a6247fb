//! One "service instance" for the multi-process tests. Each mode is a small
//! program driven by the test through argv, stdin and stdout; locks go
//! through the process-wide client, configured from `REDIS_URL`.
//!
//! Modes:
//! - `count KEY TASKS SECTIONS COUNTER [unlocked]`: TASKS tasks each run
//!   SECTIONS critical sections under `#[distributed_lock(wait)]`, each a
//!   non-atomic GET / +1 / SET of COUNTER. `unlocked` runs the same sections
//!   without the lock (the control that shows the race is real).
//! - `lottery DATE INSTANCES`: prints `ready`, waits for `go` on stdin, then
//!   calls the lottery job once; prints `won` or `skipped`.
//! - `hold KEY TTL_MS`: takes the lock with the manual API, prints
//!   `held TOKEN`, waits for `release` on stdin, releases, prints the outcome.
//! - `slow-holder KEY`: an attributed fn with ttl 300ms whose body prints
//!   `in-body` and waits for `finish` on stdin; prints `returned` after.
//! - `try KEY`: one try; prints `acquired`, `busy` or `error: MESSAGE`.
//! - `renewed KEY COUNTER`: a body under `#[distributed_lock(ttl = "500ms",
//!   renew)]` that INCRs COUNTER every 10 ms until `finish` arrives on stdin;
//!   prints `in-body` once it has started, then `returned` or
//!   `lost CAUSE` when the call returns.
//! - `contend KEY MILLIS`: tries the lock again and again for MILLIS ms;
//!   prints `tries=N acquired=M`.
//! - `fenced-writer KEY TTL_MS`: takes the lock (a fixed lease), prints
//!   `held FENCE`; on `write` from stdin writes to a fenced store under its
//!   fencing token and prints `accepted` or `rejected`.
//! - `quick-job KEY`: an attributed job with `hold_at_least = "3s"` whose
//!   body takes 100 ms; prints `ran` or `busy`.
//! - `fair-wait KEY ID`: waits for the fair lock; once it has it, appends ID
//!   to the list `order`, releases, and prints `done`.
//! - `wait KEY ID`: the same without `fair`.

use std::time::Duration;

use lock_runtime::{distributed_lock, Lock, LockError};
use redis::AsyncCommands;
use tokio::io::{AsyncBufReadExt, BufReader};

type Redis = redis::aio::MultiplexedConnection;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["count", key, tasks, sections, counter, rest @ ..] => {
            count(
                key,
                parse(tasks),
                parse(sections),
                counter,
                rest == ["unlocked"],
            )
            .await
        }
        ["lottery", date, instances] => lottery(date, parse(instances)).await,
        ["hold", key, ttl_ms] => hold(key, parse(ttl_ms)).await,
        ["slow-holder", key] => slow_holder(key).await,
        ["try", key] => try_once(key).await,
        ["renewed", key, counter] => renewed(key, counter).await,
        ["contend", key, millis] => contend(key, parse(millis)).await,
        ["fenced-writer", key, ttl_ms] => fenced_writer(key, parse(ttl_ms)).await,
        ["quick-job", key] => quick_job(key).await,
        ["fair-wait", key, id] => wait_in_line(key, id, true).await,
        ["wait", key, id] => wait_in_line(key, id, false).await,
        _ => panic!("unknown worker mode: {args:?}"),
    }
}

fn parse<T: std::str::FromStr>(text: &str) -> T {
    text.parse()
        .unwrap_or_else(|_| panic!("not a number: {text}"))
}

/// A connection of its own for the test's bookkeeping, separate from the
/// lock's client.
async fn bookkeeping() -> Redis {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL is set by the test");
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("bookkeeping connection")
}

async fn next_line() -> String {
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await
        .expect("stdin");
    line.trim().to_owned()
}

fn say(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").unwrap();
    stdout.flush().unwrap();
}

/// The non-atomic read-modify-write that mutual exclusion must protect.
async fn increment(redis: &mut Redis, counter: &str) {
    let value: i64 = redis
        .get::<_, Option<i64>>(counter)
        .await
        .unwrap()
        .unwrap_or(0);
    // Give other sections every chance to interleave.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let _: () = redis.set(counter, value + 1).await.unwrap();
}

#[distributed_lock(key = "<key>", ttl = "10s", wait = "60s", fencing)]
async fn locked_section(key: &str, redis: &mut Redis, counter: &str) -> Result<(), LockError> {
    increment(redis, counter).await;
    // The fencing tokens in the order the bodies ran.
    let fence = lock_runtime::current()
        .expect("inside the body")
        .fencing_token()
        .expect("taken with fencing");
    let _: i64 = redis
        .rpush(format!("{counter}:fences"), fence)
        .await
        .unwrap();
    Ok(())
}

async fn count(key: &str, tasks: usize, sections: usize, counter: &str, unlocked: bool) {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (key, counter) = (key.to_owned(), counter.to_owned());
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            for _ in 0..sections {
                if unlocked {
                    increment(&mut redis, &counter).await;
                } else {
                    locked_section(&key, &mut redis, &counter)
                        .await
                        .expect("section under lock");
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    say("done");
}

static WON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The noon job. Returns `()`: a busy lock is skipped and logged. The winner
/// keeps the lock until every other instance has tried, so the test shows
/// that they all skipped rather than ran one after another.
#[distributed_lock(key = "lottery:<date>", ttl = "10s")]
async fn draw_lottery(date: &str, others: usize) {
    WON.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut redis = bookkeeping().await;
    let _: i64 = redis.incr(format!("runs:{date}"), 1).await.unwrap();
    for _ in 0..others {
        let waited: Option<(String, String)> = redis
            .blpop(format!("attempted:{date}"), 10.0)
            .await
            .unwrap();
        assert!(waited.is_some(), "another instance never tried");
    }
}

async fn lottery(date: &str, instances: usize) {
    let mut redis = bookkeeping().await;
    say("ready");
    assert_eq!(next_line().await, "go");
    draw_lottery(date, instances - 1).await;
    let won = WON.load(std::sync::atomic::Ordering::SeqCst);
    if won {
        return say("won");
    }
    // `()` does not say why the body was skipped; the winner holds the lock
    // until every instance has tried, so a busy lock shows here as a held key.
    let held: bool = redis
        .exists(format!("lock:{{lottery:{date}}}"))
        .await
        .unwrap();
    let _: i64 = redis.rpush(format!("attempted:{date}"), 1).await.unwrap();
    say(if held { "skipped" } else { "failed" });
}

async fn hold(key: &str, ttl_ms: u64) {
    let guard = Lock::new(key)
        .ttl(Duration::from_millis(ttl_ms))
        .acquire()
        .await
        .expect("hold: acquire");
    say(&format!("held {}", guard.token()));
    assert_eq!(next_line().await, "release");
    match guard.release().await {
        Ok(()) => say("released"),
        Err(LockError::Lost { cause, .. }) => say(&format!("lost {cause:?}")),
        Err(error) => say(&format!("error: {error}")),
    }
}

#[distributed_lock(key = "<key>", ttl = "300ms")]
async fn slow_body(key: &str) -> Result<(), LockError> {
    say("in-body");
    assert_eq!(next_line().await, "finish");
    Ok(())
}

async fn slow_holder(key: &str) {
    slow_body(key).await.expect("slow body ran");
    say("returned");
}

async fn try_once(key: &str) {
    match Lock::new(key).try_acquire().await {
        Ok(guard) => {
            say("acquired");
            guard.release().await.expect("release");
        }
        Err(LockError::Busy { .. }) => say("busy"),
        Err(error) => say(&format!("error: {error}")),
    }
}

static FINISH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The side effects go through a reconnecting connection and their errors
/// are ignored: the tests cut and restart Redis under this body.
#[distributed_lock(key = "<key>", ttl = "500ms", renew)]
async fn renewed_body(key: &str, counter: &str) -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL is set by the test");
    let client = redis::Client::open(url).unwrap();
    let mut redis = redis::aio::ConnectionManager::new_lazy_with_config(
        client,
        redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_millis(200)))
            .set_number_of_retries(0),
    )
    .unwrap();
    say("in-body");
    while !FINISH.load(std::sync::atomic::Ordering::SeqCst) {
        let _: Result<i64, _> = redis.incr(counter, 1).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

async fn renewed(key: &str, counter: &str) {
    tokio::spawn(async {
        if next_line().await == "finish" {
            FINISH.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    match renewed_body(key, counter).await {
        Ok(()) => say("returned"),
        Err(LockError::Lost { cause, .. }) => say(&format!("lost {cause:?}")),
        Err(error) => say(&format!("error: {error}")),
    }
}

async fn contend(key: &str, millis: u64) {
    let lock = Lock::new(key).ttl(Duration::from_secs(10));
    let until = std::time::Instant::now() + Duration::from_millis(millis);
    let (mut tries, mut acquired) = (0, 0);
    while std::time::Instant::now() < until {
        tries += 1;
        match lock.try_acquire().await {
            Ok(guard) => {
                acquired += 1;
                guard.release().await.expect("release");
            }
            Err(LockError::Busy { .. }) => {}
            Err(error) => panic!("contend: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    say(&format!("tries={tries} acquired={acquired}"));
}

/// A downstream store that keeps the highest fencing token it has seen and
/// rejects writes carrying a smaller one (Kleppmann's check), as one Lua
/// script on the store.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < seen then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return 1
";

async fn fenced_writer(key: &str, ttl_ms: u64) {
    let guard = Lock::new(key)
        .ttl(Duration::from_millis(ttl_ms))
        .fencing()
        .acquire()
        .await
        .expect("fenced-writer: acquire");
    let fence = guard.fencing_token().expect("taken with fencing");
    say(&format!("held {fence}"));
    assert_eq!(next_line().await, "write");
    let mut redis = bookkeeping().await;
    let accepted: i64 = redis::Script::new(FENCED_WRITE)
        .key("store:value")
        .key("store:fence")
        .arg(format!("written under {fence}"))
        .arg(fence)
        .invoke_async(&mut redis)
        .await
        .unwrap();
    say(if accepted == 1 {
        "accepted"
    } else {
        "rejected"
    });
    let _ = guard.release().await;
}

#[distributed_lock(key = "<key>", ttl = "10s", hold_at_least = "3s")]
async fn quick_job_body(key: &str) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

async fn quick_job(key: &str) {
    match quick_job_body(key).await {
        Ok(()) => say("ran"),
        Err(error) if error.is_busy() => say("busy"),
        Err(error) => say(&format!("error: {error}")),
    }
}

async fn wait_in_line(key: &str, id: &str, fair: bool) {
    let mut lock = Lock::new(key)
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    if fair {
        lock = lock.fair();
    }
    let guard = lock.acquire().await.expect("wait: acquire");
    let mut redis = bookkeeping().await;
    let _: i64 = redis.rpush("order", id).await.unwrap();
    guard.release().await.expect("wait: release");
    say("done");
}
