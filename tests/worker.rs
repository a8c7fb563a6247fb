//! One "service instance" for the multi-process tests. Each mode is a small
//! program driven by the test through argv, stdin and stdout; locks go
//! through the process-wide client, configured from `REDIS_URL`.
//!
//! Modes:
//! - `count KEY TASKS SECTIONS COUNTER [unlocked|brief]`: TASKS tasks each run
//!   SECTIONS critical sections under `#[distributed_lock(wait, fencing)]`,
//!   each a non-atomic GET / +1 / SET of COUNTER, appending its fencing token
//!   to `COUNTER:fences`. `unlocked` runs the same sections without the lock
//!   (the control that shows the race is real); `brief` with a 1 s ttl.
//! - `sections KEY TASKS SECTIONS COUNTER`: takes and releases a free lock
//!   `KEY:warm:<pid>` (connections opened), prints `ready`, waits for `go`
//!   on stdin, then TASKS tasks each call SECTIONS times a body under
//!   `#[distributed_lock(ttl = "10s", wait = "60s", renew)]` (the issue-24
//!   scenario; a wait that runs out means a stall, not a busy lock) that does a non-atomic GET / +1 / SET of COUNTER and appends
//!   the bookkeeping server's clock (µs) to `COUNTER:ends`. Prints `longest
//!   MS` (the longest call, its wait included), then `done timeouts=T
//!   errors=E` (E: calls that failed otherwise, the first one's message
//!   after `|`).
//! - `count-until-stop KEY TASKS COUNTER TTL_MS`: TASKS tasks run the
//!   sections of `count` (fenced, and renewed, with ttl TTL_MS) until
//!   `stop` arrives on stdin; prints `ready` once started, then `done N` (N
//!   sections ran) or `failed N: ERROR`.
//! - `lottery DATE INSTANCES`: prints `ready`, waits for `go` on stdin, then
//!   calls the lottery job once; prints `won` or `skipped`.
//! - `hold KEY TTL_MS`: takes the lock with the manual API, prints
//!   `held TOKEN`, waits for `release` on stdin, releases, prints the outcome.
//! - `slow-holder KEY`: an attributed fn with ttl 300ms whose body prints
//!   `in-body` and waits for `finish` on stdin; prints `returned` after.
//! - `try KEY`: one try; prints `acquired`, `busy` or `error: MESSAGE`.
//! - `renewed KEY COUNTER`: a body under `#[distributed_lock(ttl = "1s",
//!   renew)]` that INCRs COUNTER every 10 ms until `finish` arrives on stdin;
//!   prints `in-body` once it has started, then `returned` or
//!   `lost CAUSE` when the call returns.
//! - `chaos KEY TASKS CALLS SEED`: prints `ready` (a free lock taken and
//!   released first), waits for `go`, then TASKS tasks each make CALLS
//!   calls of the manual API on KEY with options drawn from SEED: `wait`
//!   of 0 (a try), 50 ms, 300 ms or 2 s, `renew` or not, `fencing` or not,
//!   ttl 10 s, and one call in four cancelled (dropped) after a random part
//!   of its wait. A held lock runs a 0-20 ms section that INCRs
//!   `KEY:inside` on the bookkeeping server, checks it is 1 (else INCRs
//!   `KEY:overlaps`), DECRs it, and is released. Prints `done calls=N
//!   held=H cancelled=C errors=E overrun_ms=O` (O: the most any call took
//!   beyond its wait) and, after `|`, each kind of error seen once.
//! - `contend KEY MILLIS`: tries the lock again and again for MILLIS ms;
//!   prints `tries=N acquired=M`.
//! - `fenced-writer KEY TTL_MS`: takes the lock (a fixed lease), prints
//!   `held FENCE`; on `write` from stdin writes to a fenced store under its
//!   fencing token and prints `accepted` or `rejected`.
//! - `quick-job KEY [30s]`: an attributed job with `hold_at_least = "3s"`
//!   (`"30s"` with that argument) whose body takes 100 ms; prints `ran` or
//!   `busy`.
//! - `fair-wait KEY ID`: waits for the fair lock; once it has it, appends ID
//!   to the list `order`, releases, and prints `done`.
//! - `wait KEY ID`: the same without `fair`.
//!
//! Read/write lock and semaphore modes. Their sections keep their
//! bookkeeping in Redis under `KEY:...` (apart from the lock's own keys),
//! and a section that finds another holder it should not see counts a
//! violation (also INCR `KEY:violations`); the modes that run sections end
//! by printing `done` when there was none, else `violation N: FIRST`.
//! - `rw-count KEY MODE TASKS SECTIONS [overlap]`: MODE is `read` or `write`. Prints
//!   `ready`, waits for `go` on stdin, then TASKS tasks each run SECTIONS
//!   sections under the RwLock KEY (ttl 10 s, wait 60 s) on that side. A
//!   read section INCRs `KEY:readers-in` (keeping the highest value seen in
//!   `KEY:max-readers`, and the highest number of distinct processes inside
//!   at once in `KEY:max-reader-procs`), checks `KEY:writers-in` is 0, sleeps
//!   2 ms, checks again, DECRs and INCRs `KEY:read-sections`. A write
//!   section INCRs `KEY:writers-in`, checks it is 1 and `KEY:readers-in` is
//!   0, does a non-atomic GET / +1 / SET of `KEY:counter`, checks again and
//!   DECRs. MODE `write-as-read` runs the write sections under the read side
//!   (the control that shows the checks catch sharing writers). With
//!   `overlap`, a read section, once inside, waits (up to 10 s) until
//!   readers of two processes have been inside at once, so that the
//!   overlap the test looks for happens whenever the lock allows it.
//! - `rw-hammer KEY TASKS`: TASKS tasks run read sections (as `rw-count`)
//!   back to back; prints `ready` once this process finished one, and stops
//!   when `stop` arrives on stdin; prints `done` or `violation ...`.
//! - `rw-write-timed KEY WAIT_MS`: opens its client's connection (a plain
//!   lock `KEY:warm` taken and released), then takes the write side (ttl
//!   10 s, wait WAIT_MS), runs one write section holding it 20 ms, releases; prints
//!   `acquired-after MS` (MS: how long the acquire took), `timeout`, or
//!   `violation ...`.
//! - `rw-hold KEY MODE TTL_MS [WAIT_MS]`: takes the `read` or `write` side
//!   with the manual API (no renewal; waiting WAIT_MS when given), prints
//!   `held TOKEN MS` (MS: how long the acquire took), `busy` or `timeout`;
//!   once held, waits for `release` on stdin, releases, prints `released`,
//!   `lost CAUSE` or `error: MESSAGE`.
//! - `rw-try KEY MODE`: one try of that side; prints `acquired` (and
//!   releases), `busy` or `error: MESSAGE`.
//! - `sem-count KEY PERMITS TASKS SECTIONS [fill]`: prints `ready`, waits for `go`,
//!   then TASKS tasks each run SECTIONS sections holding one permit of the
//!   Semaphore KEY (ttl 10 s, wait 60 s). A section INCRs `KEY:inside`
//!   (highest value seen kept in `KEY:max-inside`) and counts the permits of
//!   the live holders in the semaphore's ZSET (highest kept in
//!   `KEY:max-holders`), each a violation above PERMITS; sleeps 2 ms, DECRs.
//!   With `fill`, a section, once inside, waits (up to 10 s) until PERMITS
//!   sections have been inside at once.
//! - `sem-hold KEY PERMITS TTL_MS [WAIT_MS]`: takes one permit (manual API,
//!   no renewal); then as `rw-hold`.
//! - `sem-try KEY PERMITS`: one try of one permit; as `rw-try`.
//!
//! Failover modes (`worker/failover.rs`):
//! - `failover-sections KEY TASKS COUNTER`: sections under a renewed,
//!   fenced attribute, going on through failed calls until `stop`.
//! - `switch-sections KEY TASKS COUNTER`: sections under a renewed
//!   attribute (ttl 10 s, wait 15 s) doing a non-atomic GET / +1 / SET of
//!   COUNTER, each recorded with its start and end in `COUNTER:sections`
//!   (stopped ones in `COUNTER:cancelled`), until `stop`.
//! - `hold-renewed KEY TTL_MS`: a renewed lock that says when it is lost.
//! - `holder`: tries, holds and releases locks as stdin says (`try KEY
//!   TTL_MS`, `release KEY`, `held KEY`), one answer line each.
//!
//! With `LOCK_ACKNOWLEDGED=N` in the environment, the process-wide client
//! is in acknowledged mode (N replicas).
//!
//! Several keys at once: `multi-rounds`, `transfer` and `stream`, in
//! `worker/multi.rs`.

use std::time::Duration;

use lock_runtime::{distributed_lock, Lock, LockError, RwLock, Semaphore};
use redis::AsyncCommands;
use tokio::io::{AsyncBufReadExt, BufReader};

#[path = "worker/failover.rs"]
mod failover;
#[path = "worker/multi.rs"]
mod multi;

type Redis = redis::aio::MultiplexedConnection;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // `LOCK_TRACE=1`: the library's events (switches learned, replays,
    // losses) on stderr, with times, for investigating a failure.
    if std::env::var_os("LOCK_TRACE").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .init();
    }
    failover::init_acknowledged();
    match args.as_slice() {
        ["failover-sections", key, tasks, counter] => {
            failover::failover_sections(key, parse(tasks), counter).await
        }
        ["switch-sections", key, tasks, counter] => {
            failover::switch_sections(key, parse(tasks), counter).await
        }
        ["hold-renewed", key, ttl_ms] => failover::hold_renewed(key, parse(ttl_ms)).await,
        ["holder"] => failover::holder().await,
        ["pass-on", key] => failover::pass_on(key).await,
        ["count", key, tasks, sections, counter, rest @ ..] => {
            count(
                key,
                parse(tasks),
                parse(sections),
                counter,
                Section::from_flag(rest.first().copied()),
            )
            .await
        }
        ["count-until-stop", key, tasks, counter, ttl_ms] => {
            count_until_stop(key, parse(tasks), counter, parse(ttl_ms)).await
        }
        ["count-spread", prefix, keys, tasks, sections] => {
            count_spread(prefix, parse(keys), parse(tasks), parse(sections)).await
        }
        ["sections", key, tasks, sections, counter] => {
            timed_sections(key, parse(tasks), parse(sections), counter).await
        }
        ["lottery", date, instances] => lottery(date, parse(instances)).await,
        ["hold", key, ttl_ms] => hold(key, parse(ttl_ms)).await,
        ["slow-holder", key] => slow_holder(key).await,
        ["try", key] => try_once(key).await,
        ["renewed", key, counter] => renewed(key, counter).await,
        ["contend", key, millis] => contend(key, parse(millis)).await,
        ["chaos", key, tasks, calls, seed] => {
            chaos(key, parse(tasks), parse(calls), parse(seed)).await
        }
        ["fenced-writer", key, ttl_ms] => fenced_writer(key, parse(ttl_ms)).await,
        ["quick-job", key] => quick_job(key, false).await,
        ["quick-job", key, "30s"] => quick_job(key, true).await,
        ["fair-wait", key, id] => wait_in_line(key, id, true).await,
        ["wait", key, id] => wait_in_line(key, id, false).await,
        ["rw-count", key, mode, tasks, sections, rest @ ..] => {
            let overlap = match rest {
                [] => false,
                ["overlap"] => true,
                _ => panic!("rw-count: unknown flags {rest:?}"),
            };
            rw_count(key, mode, parse(tasks), parse(sections), overlap).await
        }
        ["rw-hammer", key, tasks] => rw_hammer(key, parse(tasks)).await,
        ["rw-write-timed", key, wait_ms] => rw_write_timed(key, parse(wait_ms)).await,
        ["rw-hold", key, mode, ttl_ms, wait_ms @ ..] => {
            let lock = rw_lock(key, parse(ttl_ms), wait_ms.first().map(|ms| parse(ms)));
            hold_shared(side(&lock, mode)).await
        }
        ["rw-try", key, mode] => try_shared(side(&RwLock::new(*key), mode)).await,
        ["sem-count", key, permits, tasks, sections, rest @ ..] => {
            let fill = match rest {
                [] => false,
                ["fill"] => true,
                _ => panic!("sem-count: unknown flags {rest:?}"),
            };
            sem_count(key, parse(permits), parse(tasks), parse(sections), fill).await
        }
        ["sem-hold", key, permits, ttl_ms, wait_ms @ ..] => {
            let semaphore = semaphore(
                key,
                parse(permits),
                parse(ttl_ms),
                wait_ms.first().map(|ms| parse(ms)),
            );
            hold_shared(semaphore.take(1)).await
        }
        ["sem-try", key, permits] => try_shared(Semaphore::new(*key, parse(permits)).take(1)).await,
        ["multi-rounds", rounds, tasks, names @ ..] => {
            multi::multi_rounds(parse(rounds), parse(tasks), names).await
        }
        ["transfer", accounts, rounds, seed] => {
            multi::transfers(parse(accounts), parse(rounds), parse(seed)).await
        }
        ["stream", key] => multi::stream(key).await,
        _ => panic!("unknown worker mode: {args:?}"),
    }
}

fn parse<T: std::str::FromStr>(text: &str) -> T {
    text.parse()
        .unwrap_or_else(|_| panic!("not a number: {text}"))
}

/// A connection of its own for the test's bookkeeping, separate from the
/// lock's client: to `BOOKKEEPING_URL` when set (a plain server beside the
/// cluster the locks are on), else to `REDIS_URL`.
async fn bookkeeping() -> Redis {
    let url = std::env::var("BOOKKEEPING_URL")
        .or_else(|_| std::env::var("REDIS_URL"))
        .expect("REDIS_URL is set by the test");
    // The crate's default response timeout (500 ms) is short for a loaded
    // machine; the bookkeeping only needs an answer.
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(30)));
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("bookkeeping connection")
}

/// The next line on stdin. One reader for the whole process: a reader made
/// per call could buffer the line after its own and drop it with itself.
async fn next_line() -> String {
    static STDIN: std::sync::OnceLock<tokio::sync::Mutex<BufReader<tokio::io::Stdin>>> =
        std::sync::OnceLock::new();
    let stdin = STDIN.get_or_init(|| tokio::sync::Mutex::new(BufReader::new(tokio::io::stdin())));
    let mut line = String::new();
    stdin
        .lock()
        .await
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
    fenced_increment(redis, counter).await;
    Ok(())
}

#[distributed_lock(key = "<key>", ttl = "1s", wait = "60s", fencing)]
async fn brief_section(key: &str, redis: &mut Redis, counter: &str) -> Result<(), LockError> {
    fenced_increment(redis, counter).await;
    Ok(())
}

/// `increment`, and the body's fencing token appended to `<counter>:fences`.
async fn fenced_increment(redis: &mut Redis, counter: &str) {
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
}

/// What `count` does in each section.
#[derive(Clone, Copy, PartialEq)]
enum Section {
    /// Under the lock (`ttl = "10s"`).
    Locked,
    /// Under a lock with `ttl = "1s"` (for tests that restart nodes once
    /// the ttl has passed).
    Brief,
    /// Without the lock (shows that the counter needs it).
    Unlocked,
}

impl Section {
    fn from_flag(flag: Option<&str>) -> Section {
        match flag {
            None => Section::Locked,
            Some("brief") => Section::Brief,
            Some("unlocked") => Section::Unlocked,
            Some(other) => panic!("unknown count flag {other:?}"),
        }
    }
}

async fn count(key: &str, tasks: usize, sections: usize, counter: &str, section: Section) {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (key, counter) = (key.to_owned(), counter.to_owned());
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            for _ in 0..sections {
                match section {
                    Section::Unlocked => increment(&mut redis, &counter).await,
                    Section::Locked => locked_section(&key, &mut redis, &counter)
                        .await
                        .expect("section under lock"),
                    Section::Brief => brief_section(&key, &mut redis, &counter)
                        .await
                        .expect("section under lock"),
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    say("done");
}

#[distributed_lock(key = "<key>", ttl = "10s", wait = "60s", renew)]
async fn renewed_section(key: &str, redis: &mut Redis, counter: &str) -> Result<(), LockError> {
    increment(redis, counter).await;
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(redis).await.unwrap();
    let _: i64 = redis
        .rpush(format!("{counter}:ends"), seconds * 1_000_000 + micros)
        .await
        .unwrap();
    Ok(())
}

async fn timed_sections(key: &str, tasks: usize, sections: usize, counter: &str) {
    // Warm: connections open, and the client knows which nodes answer.
    let warm = Lock::new(format!("{key}:warm:{}", std::process::id()))
        .try_acquire()
        .await;
    warm.expect("a free lock")
        .release()
        .await
        .expect("released");
    say("ready");
    assert_eq!(next_line().await, "go");
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (key, counter) = (key.to_owned(), counter.to_owned());
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            let (mut timeouts, mut errors) = (0, Vec::new());
            let mut longest = Duration::ZERO;
            for _ in 0..sections {
                let called = std::time::Instant::now();
                match renewed_section(&key, &mut redis, &counter).await {
                    Ok(()) => {}
                    Err(LockError::WaitTimeout { .. }) => timeouts += 1,
                    Err(error) => errors.push(error.to_string()),
                }
                longest = longest.max(called.elapsed());
            }
            (timeouts, errors, longest)
        }));
    }
    let (mut timeouts, mut errors, mut longest) = (0, Vec::new(), Duration::ZERO);
    for handle in handles {
        let (task_timeouts, task_errors, task_longest) = handle.await.unwrap();
        timeouts += task_timeouts;
        errors.extend(task_errors);
        longest = longest.max(task_longest);
    }
    // The longest call on its own line, before the verdict.
    say(&format!("longest {}", longest.as_millis()));
    let first = errors.first().cloned().unwrap_or_default();
    say(&format!(
        "done timeouts={timeouts} errors={}|{first}",
        errors.len()
    ));
}

/// TASKS tasks run fenced, renewed sections (`fenced_increment`) under the
/// lock KEY with ttl TTL_MS (waiting up to 60 s) until `stop` arrives on
/// stdin; then each finishes its section and the process prints `done N`
/// (the sections run) or `failed N: ERROR` (the first failed call).
async fn count_until_stop(key: &str, tasks: usize, counter: &str, ttl_ms: u64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (key, counter, stop) = (key.to_owned(), counter.to_owned(), Arc::clone(&stop));
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            let lock = Lock::new(key)
                .ttl(Duration::from_millis(ttl_ms))
                .wait(Duration::from_secs(60))
                .fencing()
                .renew();
            let (mut ran, mut failed) = (0usize, None);
            while !stop.load(Ordering::Relaxed) {
                match lock.run(fenced_increment(&mut redis, &counter)).await {
                    Ok(()) => ran += 1,
                    Err(error) => {
                        failed = Some(error.to_string());
                        break;
                    }
                }
            }
            (ran, failed)
        }));
    }
    say("ready");
    assert_eq!(next_line().await, "stop");
    stop.store(true, Ordering::Relaxed);
    let (mut ran, mut failed) = (0, None);
    for handle in handles {
        let (task_ran, task_failed) = handle.await.unwrap();
        ran += task_ran;
        failed = failed.or(task_failed);
    }
    match failed {
        None => say(&format!("done {ran}")),
        Some(error) => say(&format!("failed {ran}: {error}")),
    }
}

/// `count` on `keys` locks `<prefix>:<k>` at once (spread over a cluster's
/// slots), `tasks` tasks each, with the counter `counter:<prefix>:<k>`.
async fn count_spread(prefix: &str, keys: usize, tasks: usize, sections: usize) {
    let mut handles = Vec::new();
    for k in 0..keys {
        for _ in 0..tasks {
            let key = format!("{prefix}:{k}");
            let counter = format!("counter:{key}");
            handles.push(tokio::spawn(async move {
                let mut redis = bookkeeping().await;
                for _ in 0..sections {
                    locked_section(&key, &mut redis, &counter)
                        .await
                        .expect("section under lock");
                }
            }));
        }
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
/// A 1 s ttl: renewed every ~333 ms, so a holder process held up ~330 ms on a
/// loaded machine does not lose the lock (it did with 500 ms).
#[distributed_lock(key = "<key>", ttl = "1s", renew)]
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

/// A small xorshift generator: the chaos worker's draws, repeatable from
/// the seed the test prints.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

#[derive(Default)]
struct ChaosTally {
    calls: u64,
    held: u64,
    cancelled: u64,
    errors: u64,
    overrun: Duration,
    kinds: std::collections::BTreeSet<String>,
}

async fn chaos(key: &str, tasks: u64, calls: u64, seed: u64) {
    let warm = Lock::new(format!("{key}:warm:{}", std::process::id()))
        .try_acquire()
        .await;
    warm.expect("a free lock")
        .release()
        .await
        .expect("released");
    say("ready");
    assert_eq!(next_line().await, "go");
    let mut handles = Vec::new();
    for task in 0..tasks {
        let key = key.to_owned();
        let mut draws = Draws(seed.wrapping_mul(31).wrapping_add(task + 1) | 1);
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            let mut tally = ChaosTally::default();
            for _ in 0..calls {
                chaos_call(&key, &mut draws, &mut redis, &mut tally).await;
            }
            tally
        }));
    }
    let mut total = ChaosTally::default();
    for handle in handles {
        let tally = handle.await.unwrap();
        total.calls += tally.calls;
        total.held += tally.held;
        total.cancelled += tally.cancelled;
        total.errors += tally.errors;
        total.overrun = total.overrun.max(tally.overrun);
        total.kinds.extend(tally.kinds);
    }
    let kinds: Vec<String> = total.kinds.into_iter().collect();
    say(&format!(
        "done calls={} held={} cancelled={} errors={} overrun_ms={}|{}",
        total.calls,
        total.held,
        total.cancelled,
        total.errors,
        total.overrun.as_millis(),
        kinds.join("; ")
    ));
}

async fn chaos_call(key: &str, draws: &mut Draws, redis: &mut Redis, tally: &mut ChaosTally) {
    let wait = [0, 50, 300, 2_000][draws.below(4) as usize];
    let mut lock = Lock::new(key).ttl(Duration::from_secs(10));
    if wait > 0 {
        lock = lock.wait(Duration::from_millis(wait));
    }
    if draws.below(2) == 0 {
        lock = lock.renew();
    }
    if draws.below(2) == 0 {
        lock = lock.fencing();
    }
    let cancel_after = (draws.below(4) == 0).then(|| Duration::from_millis(draws.below(wait + 1)));
    let section = Duration::from_millis(draws.below(21));
    tally.calls += 1;
    let started = std::time::Instant::now();
    let outcome = match cancel_after {
        Some(after) => tokio::time::timeout(after, lock.acquire()).await.ok(),
        None => Some(lock.acquire().await),
    };
    let took = started.elapsed();
    tally.overrun = tally
        .overrun
        .max(took.saturating_sub(Duration::from_millis(wait)));
    match outcome {
        None => tally.cancelled += 1,
        Some(Ok(guard)) => {
            tally.held += 1;
            let inside: i64 = redis.incr(format!("{key}:inside"), 1).await.unwrap();
            if inside != 1 {
                let _: i64 = redis.incr(format!("{key}:overlaps"), 1).await.unwrap();
            }
            tokio::time::sleep(section).await;
            let _: i64 = redis.decr(format!("{key}:inside"), 1).await.unwrap();
            if let Err(error) = guard.release().await {
                tally.errors += 1;
                tally.kinds.insert(format!("release: {error}"));
            }
        }
        Some(Err(LockError::Busy { .. } | LockError::WaitTimeout { .. })) => {}
        Some(Err(error)) => {
            tally.errors += 1;
            // The kind of error, without the figures that vary.
            let text = error.to_string();
            let kind = text.split(" (not answering").next().unwrap_or(&text);
            tally.kinds.insert(kind.to_owned());
        }
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

#[distributed_lock(key = "<key>", ttl = "60s", hold_at_least = "30s")]
async fn long_quick_job_body(key: &str) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

async fn quick_job(key: &str, long: bool) {
    let outcome = if long {
        long_quick_job_body(key).await
    } else {
        quick_job_body(key).await
    };
    match outcome {
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

// ---------------------------------------------------------------------------
// Read/write lock and semaphore modes.

/// The sections' checks found this many holders that should not be there;
/// the first one's description.
static VIOLATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static FIRST_VIOLATION: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn violation(redis: &mut Redis, key: &str, what: String) {
    let _: i64 = redis.incr(format!("{key}:violations"), 1).await.unwrap();
    VIOLATIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    FIRST_VIOLATION.lock().unwrap().get_or_insert(what);
}

/// `done`, or `violation N: FIRST`.
fn report_violations() {
    match VIOLATIONS.load(std::sync::atomic::Ordering::SeqCst) {
        0 => say("done"),
        count => {
            let first = FIRST_VIOLATION.lock().unwrap().clone().unwrap_or_default();
            say(&format!("violation {count}: {first}"));
        }
    }
}

fn rw_lock(key: &str, ttl_ms: u64, wait_ms: Option<u64>) -> RwLock {
    let lock = RwLock::new(key).ttl(Duration::from_millis(ttl_ms));
    match wait_ms {
        Some(wait_ms) => lock.wait(Duration::from_millis(wait_ms)),
        None => lock,
    }
}

fn semaphore(key: &str, permits: u32, ttl_ms: u64, wait_ms: Option<u64>) -> Semaphore {
    let semaphore = Semaphore::new(key, permits).ttl(Duration::from_millis(ttl_ms));
    match wait_ms {
        Some(wait_ms) => semaphore.wait(Duration::from_millis(wait_ms)),
        None => semaphore,
    }
}

fn side(lock: &RwLock, mode: &str) -> Lock {
    match mode {
        "read" => lock.read(),
        "write" => lock.write(),
        _ => panic!("mode is `read` or `write`, not {mode:?}"),
    }
}

/// Enters a read section: counts this reader in, keeps the highest number
/// of readers and of reader processes seen inside at once, and returns the
/// writers inside.
const READER_IN: &str = r"
local v = redis.call('INCR', KEYS[1])
if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
local p = redis.call('HLEN', KEYS[3])
if p > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], p) end
return tonumber(redis.call('GET', KEYS[5]) or '0')
";

/// Leaves a read section; returns the writers inside.
const READER_OUT: &str = r"
redis.call('DECR', KEYS[1])
if redis.call('HINCRBY', KEYS[3], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[3], ARGV[1]) end
redis.call('INCR', KEYS[6])
return tonumber(redis.call('GET', KEYS[5]) or '0')
";

/// `{writers inside, readers inside}`, after counting this writer in (ARGV
/// 1) or not (0).
const WRITER_CHECK: &str = r"
local w = tonumber(ARGV[1]) == 1 and redis.call('INCR', KEYS[1]) or tonumber(redis.call('GET', KEYS[1]) or '0')
return {w, tonumber(redis.call('GET', KEYS[2]) or '0')}
";

async fn reader_script(redis: &mut Redis, key: &str, script: &str) -> i64 {
    redis::Script::new(script)
        .key(format!("{key}:readers-in"))
        .key(format!("{key}:max-readers"))
        .key(format!("{key}:procs-in"))
        .key(format!("{key}:max-reader-procs"))
        .key(format!("{key}:writers-in"))
        .key(format!("{key}:read-sections"))
        .arg(std::process::id())
        .invoke_async(redis)
        .await
        .unwrap()
}

/// Waits (up to 10 s) until the number at `key` is at least `target`.
async fn reach(redis: &mut Redis, key: &str, target: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let reached: Option<i64> = redis.get(key).await.unwrap();
        if reached.unwrap_or(0) >= target {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn read_section(redis: &mut Redis, key: &str, overlap: bool) {
    let writers = reader_script(redis, key, READER_IN).await;
    if writers != 0 {
        let what = format!("a reader entered beside {writers} writer(s)");
        violation(redis, key, what).await;
    }
    if overlap {
        reach(redis, &format!("{key}:max-reader-procs"), 2).await;
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let writers = reader_script(redis, key, READER_OUT).await;
    if writers != 0 {
        let what = format!("a reader left beside {writers} writer(s)");
        violation(redis, key, what).await;
    }
}

async fn writer_check(redis: &mut Redis, key: &str, enter: bool, when: &str) {
    let (writers, readers): (i64, i64) = redis::Script::new(WRITER_CHECK)
        .key(format!("{key}:writers-in"))
        .key(format!("{key}:readers-in"))
        .arg(i64::from(enter))
        .invoke_async(redis)
        .await
        .unwrap();
    if writers != 1 || readers != 0 {
        let what =
            format!("a writer {when} with {writers} writer(s) and {readers} reader(s) inside");
        violation(redis, key, what).await;
    }
}

async fn write_section(redis: &mut Redis, key: &str, hold: Duration) {
    writer_check(redis, key, true, "entered").await;
    increment(redis, &format!("{key}:counter")).await;
    tokio::time::sleep(hold).await;
    writer_check(redis, key, false, "left").await;
    let _: i64 = redis.decr(format!("{key}:writers-in"), 1).await.unwrap();
}

async fn rw_count(key: &str, mode: &str, tasks: usize, sections: usize, overlap: bool) {
    let lock = rw_lock(key, 10_000, Some(60_000));
    let (side, write) = match mode {
        "read" => (lock.read(), false),
        "write" => (lock.write(), true),
        "write-as-read" => (lock.read(), true),
        _ => panic!("rw-count: unknown mode {mode:?}"),
    };
    let mut connections = Vec::new();
    for _ in 0..tasks {
        connections.push(bookkeeping().await);
    }
    say("ready");
    assert_eq!(next_line().await, "go");
    let mut handles = Vec::new();
    for mut redis in connections {
        let (side, key) = (side.clone(), key.to_owned());
        handles.push(tokio::spawn(async move {
            for _ in 0..sections {
                let section = async {
                    if write {
                        write_section(&mut redis, &key, Duration::ZERO).await;
                    } else {
                        read_section(&mut redis, &key, overlap).await;
                    }
                };
                side.run(section)
                    .await
                    .expect("rw-count: section under the lock");
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    report_violations();
}

async fn rw_hammer(key: &str, tasks: usize) {
    let reader = rw_lock(key, 10_000, Some(60_000)).read();
    let first = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (reader, key, first) = (reader.clone(), key.to_owned(), first.clone());
        handles.push(tokio::spawn(async move {
            let mut redis = bookkeeping().await;
            while !STOP.load(std::sync::atomic::Ordering::SeqCst) {
                reader
                    .run(read_section(&mut redis, &key, false))
                    .await
                    .expect("rw-hammer: section under the lock");
                first.notify_one();
            }
        }));
    }
    first.notified().await;
    say("ready");
    assert_eq!(next_line().await, "stop");
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
    for handle in handles {
        handle.await.unwrap();
    }
    report_violations();
}

async fn rw_write_timed(key: &str, wait_ms: u64) {
    let writer = rw_lock(key, 10_000, Some(wait_ms)).write();
    let mut redis = bookkeeping().await;
    // The connection is open before the clock starts.
    Lock::new(format!("{key}:warm"))
        .try_acquire()
        .await
        .expect("rw-write-timed: warm-up")
        .release()
        .await
        .expect("rw-write-timed: warm-up release");
    let started = std::time::Instant::now();
    let guard = match writer.acquire().await {
        Ok(guard) => guard,
        Err(LockError::WaitTimeout { .. }) => return say("timeout"),
        Err(error) => return say(&format!("error: {error}")),
    };
    let took = started.elapsed();
    write_section(&mut redis, key, Duration::from_millis(20)).await;
    guard.release().await.expect("rw-write-timed: release");
    if VIOLATIONS.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        say(&format!("acquired-after {}", took.as_millis()));
    } else {
        report_violations();
    }
}

/// Takes `lock` (a side of a read/write lock, or permits), prints the
/// outcome, and holds it until `release` arrives on stdin.
async fn hold_shared(lock: Lock) {
    let started = std::time::Instant::now();
    let guard = match lock.acquire().await {
        Ok(guard) => guard,
        Err(LockError::Busy { .. }) => return say("busy"),
        Err(LockError::WaitTimeout { .. }) => return say("timeout"),
        Err(error) => return say(&format!("error: {error}")),
    };
    say(&format!(
        "held {} {}",
        guard.token(),
        started.elapsed().as_millis()
    ));
    assert_eq!(next_line().await, "release");
    match guard.release().await {
        Ok(()) => say("released"),
        Err(LockError::Lost { cause, .. }) => say(&format!("lost {cause:?}")),
        Err(error) => say(&format!("error: {error}")),
    }
}

async fn try_shared(lock: Lock) {
    match lock.try_acquire().await {
        Ok(guard) => {
            say("acquired");
            guard.release().await.expect("release");
        }
        Err(LockError::Busy { .. }) => say("busy"),
        Err(error) => say(&format!("error: {error}")),
    }
}

/// Enters a semaphore section: counts this holder in and the permits of the
/// live holders in the semaphore's ZSET (`KEYS[3]`; the `#capacity:N` member
/// left out), keeping the highest of each; returns both.
const PERMIT_IN: &str = r"
local v = redis.call('INCR', KEYS[1])
if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = 0
local members = redis.call('ZRANGE', KEYS[3], '0', '-1', 'WITHSCORES')
for i = 1, #members, 2 do
  local member, expiry = members[i], tonumber(members[i + 1])
  if string.sub(member, 1, 1) ~= '#' and expiry > now then
    held = held + tonumber(string.match(member, '^(%d+)|'))
  end
end
if held > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], held) end
return {v, held}
";

async fn permit_section(redis: &mut Redis, key: &str, permits: i64, fill: bool) {
    let (inside, held): (i64, i64) = redis::Script::new(PERMIT_IN)
        .key(format!("{key}:inside"))
        .key(format!("{key}:max-inside"))
        .key(format!("lock:{{{key}}}:sem"))
        .key(format!("{key}:max-holders"))
        .invoke_async(redis)
        .await
        .unwrap();
    if inside > permits || held > permits {
        let what = format!("{inside} inside and {held} permits held, of {permits}");
        violation(redis, key, what).await;
    }
    if fill {
        reach(redis, &format!("{key}:max-inside"), permits).await;
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let _: i64 = redis.decr(format!("{key}:inside"), 1).await.unwrap();
}

async fn sem_count(key: &str, permits: u32, tasks: usize, sections: usize, fill: bool) {
    let semaphore = semaphore(key, permits, 10_000, Some(60_000));
    let mut connections = Vec::new();
    for _ in 0..tasks {
        connections.push(bookkeeping().await);
    }
    say("ready");
    assert_eq!(next_line().await, "go");
    let mut handles = Vec::new();
    for mut redis in connections {
        let (semaphore, key) = (semaphore.clone(), key.to_owned());
        handles.push(tokio::spawn(async move {
            for _ in 0..sections {
                semaphore
                    .run(permit_section(&mut redis, &key, i64::from(permits), fill))
                    .await
                    .expect("sem-count: section holding a permit");
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    report_violations();
}
