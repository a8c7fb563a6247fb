#![allow(unused_variables)]

use lock_runtime::distributed_lock;

#[distributed_lock(key = "lottery:<dte>")]
async fn draw(date: String, round: u32) {}

fn main() {}
