#![allow(unused_variables)]

use lock_runtime::distributed_lock;

#[distributed_lock(key = "lottery:<date")]
async fn draw(date: String) {}

fn main() {}
