use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", read, ttl = "5s", read)]
async fn job() {}

fn main() {}
