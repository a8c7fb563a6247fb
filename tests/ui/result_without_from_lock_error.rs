use lock_runtime::distributed_lock;

#[derive(Debug)]
struct JobError;

#[distributed_lock(key = "job")]
async fn job() -> Result<(), JobError> {
    Ok(())
}

fn main() {}
