use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", hold_at_least = "600000m")]
async fn job() {}

fn main() {}
