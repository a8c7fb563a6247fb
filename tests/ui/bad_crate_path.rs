use lock_runtime::distributed_lock;

#[distributed_lock(key = "order:<id>", crate = "my_service::locks<T>")]
async fn settle(id: u64) {
    let _ = id;
}

fn main() {}
