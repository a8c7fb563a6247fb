//! The lottery: at noon every instance of the service fires the same job;
//! exactly one may draw the 10 winners.
//!
//! `cargo run -p lottery` starts a throwaway redis-server (unless `REDIS_URL`
//! is set), seeds 1,000 users, then starts several instances of this program
//! as separate processes. Each instance's "scheduler" fires at the same
//! instant and calls `draw_lottery(date)`, which is annotated with
//! `#[distributed_lock(key = "lottery:<date>", ttl = "10s")]`. One instance
//! gets the lock and draws; the others find it busy and skip.
//!
//! Options: `--instances N` (default 4), `--date YYYY-MM-DD` (default today,
//! UTC).

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{distributed_lock, LockError};
use redis::AsyncCommands;
use test_support::{Process, RedisServer};

const USERS: usize = 1_000;
const WINNERS: isize = 10;

/// Why a draw did not happen.
#[derive(Debug)]
enum LotteryError {
    /// The lock was not taken: another instance is drawing (or Redis failed).
    Lock(LockError),
    /// Redis failed inside the draw.
    Redis(redis::RedisError),
}

impl From<LockError> for LotteryError {
    fn from(error: LockError) -> Self {
        LotteryError::Lock(error)
    }
}

impl From<redis::RedisError> for LotteryError {
    fn from(error: redis::RedisError) -> Self {
        LotteryError::Redis(error)
    }
}

/// The noon job. Runs in at most one instance at a time for a given date.
///
/// The body is also idempotent (it keeps an earlier draw for the date): an
/// instance whose scheduler fires only after the winner has finished and
/// released would otherwise draw a second time.
#[distributed_lock(key = "lottery:<date>", ttl = "10s")]
async fn draw_lottery(
    date: &str,
    redis: &mut redis::aio::MultiplexedConnection,
) -> Result<Draw, LotteryError> {
    let winners_key = format!("lottery:winners:{date}");
    let earlier: Vec<String> = redis.lrange(&winners_key, 0, -1).await?;
    if !earlier.is_empty() {
        return Ok(Draw::AlreadyDrawn);
    }
    let winners: Vec<String> = redis.srandmember_multiple("lottery:users", WINNERS).await?;
    let _: () = redis.rpush(&winners_key, &winners).await?;
    Ok(Draw::Drew(winners))
}

/// What the instance holding the lock found.
enum Draw {
    Drew(Vec<String>),
    AlreadyDrawn,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match args.first().map(String::as_str) {
        Some("instance") => runtime.block_on(instance(&args[1..])),
        _ => coordinator(&args),
    }
}

fn option(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn today_utc() -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = (now_millis() / 86_400_000) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// Starts Redis if needed, seeds the users, runs the instances and checks
/// that exactly one drew.
fn coordinator(args: &[String]) -> ExitCode {
    let instances: usize = option(args, "--instances")
        .map(|n| n.parse().expect("--instances takes a number"))
        .unwrap_or(4);
    let date = option(args, "--date").unwrap_or_else(today_utc);

    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => (None, url),
        _ => {
            let server = RedisServer::start();
            println!(
                "started a throwaway redis-server on 127.0.0.1:{}",
                server.port()
            );
            let url = server.url();
            (Some(server), url)
        }
    };
    let seeded = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(seed_users(&url, &date));
    if let Err(error) = seeded {
        eprintln!("cannot reach Redis: {error}");
        return ExitCode::FAILURE;
    }

    // Every instance's scheduler fires at the same instant: "noon".
    let noon = (now_millis() + 500).to_string();
    let program = std::env::current_exe().expect("own path");
    println!("{instances} instances, lottery for {date}; firing at the same instant...");
    let mut children: Vec<Process> = (1..=instances)
        .map(|n| {
            let n = n.to_string();
            Process::spawn(&program, &["instance", &n, &date, &noon], Some(&url))
        })
        .collect();
    let mut drew = 0;
    for child in &mut children {
        let line = child.line(Duration::from_secs(60));
        if line.contains("drew") {
            drew += 1;
        }
        println!("{line}");
    }
    if drew == 1 {
        println!("exactly one instance drew the winners");
        ExitCode::SUCCESS
    } else {
        println!("expected exactly one instance to draw, {drew} did");
        ExitCode::FAILURE
    }
}

async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

async fn seed_users(url: &str, date: &str) -> redis::RedisResult<()> {
    let mut redis = connect(url).await?;
    let users: Vec<String> = (1..=USERS).map(|n| format!("user:{n}")).collect();
    let _: () = redis.sadd("lottery:users", users).await?;
    // A fresh demo: forget an earlier draw for the same date.
    let _: () = redis.del(format!("lottery:winners:{date}")).await?;
    Ok(())
}

/// One service instance: waits for noon, runs the job, says what happened.
async fn instance(args: &[String]) -> ExitCode {
    let [number, date, noon] = args else {
        eprintln!("usage: lottery instance N DATE NOON_UNIX_MS");
        return ExitCode::FAILURE;
    };
    let url = std::env::var("REDIS_URL").expect("the coordinator sets REDIS_URL");
    if let Err(error) = lock_runtime::init(url.clone()) {
        println!("instance {number}: {error}");
        return ExitCode::FAILURE;
    }
    let mut redis = match connect(&url).await {
        Ok(redis) => redis,
        Err(error) => {
            println!("instance {number}: cannot reach Redis: {error}");
            return ExitCode::FAILURE;
        }
    };
    let noon: u64 = noon.parse().expect("noon is a unix time in ms");
    tokio::time::sleep(Duration::from_millis(noon.saturating_sub(now_millis()))).await;

    match draw_lottery(date, &mut redis).await {
        Ok(Draw::Drew(winners)) => {
            println!(
                "instance {number}: got the lock and drew {} winners: {}",
                winners.len(),
                winners.join(", ")
            );
            ExitCode::SUCCESS
        }
        Ok(Draw::AlreadyDrawn) => {
            println!("instance {number}: got the lock after the draw; kept the earlier winners");
            ExitCode::SUCCESS
        }
        Err(LotteryError::Lock(error)) if error.is_busy() => {
            println!("instance {number}: skipped, another instance holds lottery:{date}");
            ExitCode::SUCCESS
        }
        Err(LotteryError::Lock(error)) => {
            println!("instance {number}: lock failed: {error}");
            ExitCode::FAILURE
        }
        Err(LotteryError::Redis(error)) => {
            println!("instance {number}: draw failed: {error}");
            ExitCode::FAILURE
        }
    }
}
