use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "5s", ttl = "10s")]
async fn job() {}

fn main() {}
