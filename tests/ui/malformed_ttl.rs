use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "ten seconds")]
async fn job() {}

fn main() {}
