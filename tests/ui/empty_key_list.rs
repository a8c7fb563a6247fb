use lock_runtime::distributed_lock;

#[distributed_lock(key = [])]
async fn transfer(from: u64, to: u64) {
    let _ = (from, to);
}

fn main() {}
