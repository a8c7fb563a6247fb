use lock_runtime::distributed_lock;

#[distributed_lock(key = "order:<id>", client = "redis://127.0.0.1:6379/")]
async fn settle(id: u64) {
    let _ = id;
}

fn main() {}
