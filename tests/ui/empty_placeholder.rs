#![allow(unused_variables)]

use lock_runtime::distributed_lock;

#[distributed_lock(key = "lottery:<>")]
async fn draw(date: String) {}

fn main() {}
