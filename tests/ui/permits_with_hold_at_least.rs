use lock_runtime::distributed_lock;

#[distributed_lock(key = "exports", permits = 4, hold_at_least = "30s")]
async fn job() {}

fn main() {}
