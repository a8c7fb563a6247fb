use lock_runtime::distributed_lock;

#[distributed_lock(key = "")]
async fn draw() {}

fn main() {}
