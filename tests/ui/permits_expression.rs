use lock_runtime::distributed_lock;

const MAX_EXPORTS: u32 = 4;

#[distributed_lock(key = "job", permits = MAX_EXPORTS)]
async fn job() {}

fn main() {}
