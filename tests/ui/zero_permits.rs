use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", permits = 0)]
async fn job() {}

fn main() {}
