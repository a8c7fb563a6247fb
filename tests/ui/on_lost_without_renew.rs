use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", on_lost = "continue")]
async fn job() {}

fn main() {}
