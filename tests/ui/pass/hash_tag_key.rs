// Braces that name no parameter are literal text: a Redis Cluster hash tag
// (`{tenant}`), or a hash tag around a value (`{<region>}`).
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "{tenant}:job:<id>", ttl = "10s")]
async fn job(id: u64) -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "{<region>}:orders:<id>", ttl = "10s")]
async fn settle(region: &str, id: u64) -> Option<()> {
    Some(())
}

fn main() {
    // Compiled, not run: no Redis here.
    let _ = (job, settle);
}
