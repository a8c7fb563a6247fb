use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", read, permits = 4)]
async fn job() {}

fn main() {}
