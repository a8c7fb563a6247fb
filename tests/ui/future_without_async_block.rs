use std::future::Future;
use std::pin::Pin;

use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
fn job() -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(std::future::ready(()))
}

fn main() {}
