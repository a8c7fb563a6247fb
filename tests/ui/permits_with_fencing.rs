use lock_runtime::distributed_lock;

#[distributed_lock(key = "exports", fencing, permits = 4)]
async fn job() {}

fn main() {}
