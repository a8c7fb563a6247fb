use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", permits = "4")]
async fn job() {}

fn main() {}
