use lock_runtime::distributed_lock;

struct Order {
    kind: u32,
}

#[distributed_lock(key = "order:<order.type>")]
async fn settle(order: Order) {
    let _ = order.kind;
}

fn main() {}
