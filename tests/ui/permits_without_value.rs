use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", permits)]
async fn job() {}

fn main() {}
