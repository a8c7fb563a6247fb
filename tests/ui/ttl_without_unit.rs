use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10")]
async fn job() {}

fn main() {}
