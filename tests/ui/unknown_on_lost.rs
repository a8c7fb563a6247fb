use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10s", renew, on_lost = "ignore")]
async fn job() {}

fn main() {}
