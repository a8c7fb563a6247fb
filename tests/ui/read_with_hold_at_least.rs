use lock_runtime::distributed_lock;

#[distributed_lock(key = "prices", read, ttl = "5s", hold_at_least = "30s")]
async fn job() {}

fn main() {}
