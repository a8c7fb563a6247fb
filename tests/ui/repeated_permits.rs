use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", permits = 2, permits = 3)]
async fn job() {}

fn main() {}
