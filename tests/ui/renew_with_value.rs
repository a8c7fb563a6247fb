use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", renew = true)]
async fn job() {}

fn main() {}
