use lock_runtime::distributed_lock;

type JobResult = u32;

#[distributed_lock(key = "job")]
async fn job() -> JobResult {
    7
}

fn main() {}
