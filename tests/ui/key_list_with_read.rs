use lock_runtime::distributed_lock;

#[distributed_lock(key = ["account:<from>", "account:<to>"], read)]
async fn audit(from: u64, to: u64) {
    let _ = (from, to);
}

fn main() {}
