mod locks {}

#[lock_runtime::distributed_lock(key = "order:<id>", crate = "crate::locks")]
async fn settle(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {}
