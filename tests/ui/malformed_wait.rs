use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", wait = "5 minutes")]
async fn job() {}

fn main() {}
