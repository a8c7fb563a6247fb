// `{id}` as in `format!`: braces are literal text in a key, so every order
// would share the one lock `order:{id}`. The error says to write `<id>`,
// and `id` (used only by the key) brings no `unused variable` warning.
use lock_runtime::{distributed_lock, LockError};

#[distributed_lock(key = "order:{id}", ttl = "10s")]
async fn settle(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
