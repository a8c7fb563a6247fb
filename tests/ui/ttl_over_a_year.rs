use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "9000h")]
async fn job() {}

fn main() {}
