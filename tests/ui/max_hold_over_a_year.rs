use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10s", renew, max_hold = "8760h1ms")]
async fn job() {}

fn main() {}
