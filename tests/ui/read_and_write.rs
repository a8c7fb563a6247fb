use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", read, write)]
async fn job() {}

fn main() {}
