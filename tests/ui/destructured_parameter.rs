use lock_runtime::distributed_lock;

#[distributed_lock(key = "pair:<a>")]
async fn pair((a, b): (u32, u32)) {
    let _ = (a, b);
}

fn main() {}
