//! Several keys at once: templates, literals and a hash tag mixed, a
//! duplicate, and every option a single lock takes.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = ["{bank}:account:<from>", "{bank}:account:<to>", "ledger"], ttl = "10s", wait = "2s", renew, max_hold = "1m", fair, fencing, hold_at_least = "1s")]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    let token = lock_runtime::current().and_then(|lock| lock.fencing_token());
    Ok(from + to + token.unwrap_or(0))
}

#[distributed_lock(key = ["job"])]
async fn one_key_list() {}

fn main() {
    let _ = (transfer(1, 1), one_key_list());
}
