//! A scheduled job that runs once per tick across every instance of the
//! service.
//!
//! Every instance runs the same tokio-cron-scheduler job every second
//! (`"* * * * * *"`), calling `report(tick)` with the current Unix second.
//! `report` is annotated with
//! `#[distributed_lock(key = "report:<tick>", ttl = "10s", hold_at_least = "10s")]`:
//! the first instance to fire takes `report:<tick>` and runs the body; the
//! others find the lock busy and skip. The body takes a millisecond, so without
//! `hold_at_least` an instance whose scheduler fires a few hundred
//! milliseconds later (each scheduler checks its jobs every 500 ms) would find
//! the lock already released and run the tick a second time. `hold_at_least`
//! keeps the lock 10 s after it was taken, whenever the body finishes: far
//! longer than instances can fire apart (the key names the tick, so this
//! holds nothing up for the next one).
//!
//! The body records the run in Redis (`RPUSH runs:<tick> <instance>`) and
//! prints `ran <tick>`. Each firing prints `fired <tick>` when the scheduler
//! fires (its tick: the second it fires in, which a late scheduler may
//! make the next one) and `done <tick>` once `report` returned, whether it
//! ran or skipped. Run a few instances against one Redis:
//!
//! ```sh
//! export REDIS_URL=redis://127.0.0.1:6379/
//! cargo run -p cron-report -- a & cargo run -p cron-report -- b & cargo run -p cron-report -- c
//! redis-cli lrange runs:$(( $(date +%s) - 1 )) 0 -1   # one instance name per tick
//! ```
//!
//! `tests/three_instances.rs` checks that each tick ran exactly once, in an
//! instance that fired for it.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use lock_runtime::distributed_lock;
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use tokio_cron_scheduler::{Job, JobScheduler};

/// What the job body needs: this instance's name and a Redis connection.
struct Instance {
    name: String,
    redis: ConnectionManager,
}

static INSTANCE: OnceLock<Instance> = OnceLock::new();

/// The job: runs in one instance per tick. The others return at once (a busy
/// lock is logged at `info` level with `tracing`).
#[distributed_lock(key = "report:<tick>", ttl = "10s", hold_at_least = "10s")]
async fn report(tick: u64) {
    let instance = INSTANCE
        .get()
        .expect("set in main before the scheduler starts");
    let mut redis = instance.redis.clone();
    let recorded: redis::RedisResult<()> =
        redis.rpush(format!("runs:{tick}"), &instance.name).await;
    match recorded {
        Ok(()) => println!("ran {tick}"),
        Err(error) => eprintln!("{}: tick {tick} not recorded: {error}", instance.name),
    }
}

/// The Unix second now. The scheduler fires a second's job in that second
/// (never early, up to 500 ms late), so this is the tick being run.
fn unix_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("pid-{}", std::process::id()));
    let url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL, e.g. redis://127.0.0.1/")?;
    lock_runtime::init(url.clone())?;
    let redis = redis::Client::open(url)?.get_connection_manager().await?;
    let _ = INSTANCE.set(Instance {
        name: name.clone(),
        redis,
    });

    let scheduler = JobScheduler::new().await?;
    scheduler
        .add(Job::new_async("* * * * * *", |_, _| {
            // Printed in firing order (before the job's task starts).
            let tick = unix_second();
            println!("fired {tick}");
            Box::pin(async move {
                report(tick).await;
                println!("done {tick}");
            })
        })?)
        .await?;
    scheduler.start().await?;
    println!("started {name}");

    // Runs until killed.
    std::future::pending::<()>().await;
    Ok(())
}
