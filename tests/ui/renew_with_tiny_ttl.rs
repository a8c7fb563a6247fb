use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", renew, ttl = "9ms")]
async fn job() {}

fn main() {}
