use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", timeout = "5s")]
async fn job() {}

fn main() {}
