//! Transfers between bank accounts, from several processes at once.
//!
//! Each account `i` has its balance in Redis under `balance:<i>`. A transfer
//! reads both balances, then writes both back (a read-modify-write, not
//! atomic in Redis): two transfers touching one account at the same time
//! would lose money. `transfer` is annotated with
//! `#[distributed_lock(key = ["account:<from>", "account:<to>"], ...)]`: it
//! takes both accounts' locks, every one or none, so two transfers sharing
//! an account run one after the other, and a transfer from 1 to 2 and one
//! from 2 to 1 never wait for each other forever (the set is taken whole, in
//! one script on one Redis server). A transfer from an account to itself
//! takes that one lock once.
//!
//! ```sh
//! export REDIS_URL=redis://127.0.0.1:6379/
//! cargo run -p transfer -- init 10          # 10 accounts of 1000 each
//! cargo run -p transfer -- run 10 500 1 & cargo run -p transfer -- run 10 500 2 & cargo run -p transfer -- run 10 500 3
//! cargo run -p transfer -- total 10         # 10000, always
//! ```
//!
//! `run ACCOUNTS TRANSFERS SEED` makes TRANSFERS random transfers (drawn
//! from SEED) of 1 to 100 between the ACCOUNTS accounts, from 4 tasks, and
//! prints `done <transfers> <errors>`. `tests/several_processes.rs` runs
//! three such processes and checks the total.

use lock_runtime::{distributed_lock, LockError};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

/// Moves `amount` from `from` to `to`: a read of both balances and a write
/// of both, under the locks of both accounts.
#[distributed_lock(key = ["account:<from>", "account:<to>"], ttl = "10s", wait = "30s")]
async fn transfer(
    redis: &mut ConnectionManager,
    from: u32,
    to: u32,
    amount: i64,
) -> Result<(), LockError> {
    if from == to {
        return Ok(());
    }
    let (from_key, to_key) = (format!("balance:{from}"), format!("balance:{to}"));
    let from_balance: i64 = redis.get(&from_key).await.map_err(redis_error)?;
    let to_balance: i64 = redis.get(&to_key).await.map_err(redis_error)?;
    // Another transfer would interleave here without the locks.
    tokio::task::yield_now().await;
    let () = redis
        .set(&from_key, from_balance - amount)
        .await
        .map_err(redis_error)?;
    let () = redis
        .set(&to_key, to_balance + amount)
        .await
        .map_err(redis_error)?;
    Ok(())
}

fn redis_error(source: redis::RedisError) -> LockError {
    LockError::Redis {
        name: "balance".to_owned(),
        operation: "bookkeeping",
        server: String::new(),
        source,
    }
}

/// A small deterministic generator (xorshift), so a seed replays a run.
struct Draws(u64);

impl Draws {
    fn below(&mut self, bound: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(bound)) as u32
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> u32 { args[i].parse().expect("a number") };
    let url = std::env::var(lock_runtime::REDIS_URL_ENV)?;
    let redis = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    match args.first().map(String::as_str) {
        Some("init") => {
            let mut redis = redis;
            for account in 0..number(1) {
                let () = redis.set(format!("balance:{account}"), 1000).await?;
            }
            println!("ready");
        }
        Some("total") => {
            let mut redis = redis;
            let mut total = 0i64;
            for account in 0..number(1) {
                total += redis.get::<_, i64>(format!("balance:{account}")).await?;
            }
            println!("{total}");
        }
        Some("run") => {
            lock_runtime::init(&url)?;
            let (accounts, transfers, seed) = (number(1), number(2), u64::from(number(3)));
            let tasks: Vec<_> = (0..4u64)
                .map(|task| {
                    let mut redis = redis.clone();
                    let mut draws = Draws((seed << 8 | task).max(1));
                    tokio::spawn(async move {
                        let (mut done, mut errors) = (0u32, 0u32);
                        for _ in 0..transfers / 4 {
                            let from = draws.below(accounts);
                            let to = draws.below(accounts);
                            let amount = i64::from(draws.below(100)) + 1;
                            match transfer(&mut redis, from, to, amount).await {
                                Ok(()) => done += 1,
                                Err(error) => {
                                    eprintln!("transfer {from} -> {to}: {error}");
                                    errors += 1;
                                }
                            }
                        }
                        (done, errors)
                    })
                })
                .collect();
            let (mut done, mut errors) = (0, 0);
            for task in tasks {
                let (ok, failed) = task.await?;
                done += ok;
                errors += failed;
            }
            println!("done {done} {errors}");
        }
        _ => {
            eprintln!(
                "usage: transfer init ACCOUNTS | run ACCOUNTS TRANSFERS SEED | total ACCOUNTS"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}
