use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10s", max_hold = "10m")]
async fn job() {}

fn main() {}
