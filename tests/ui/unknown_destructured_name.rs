use lock_runtime::distributed_lock;

struct State<T>(T);
struct Path<T>(T);

#[derive(Clone)]
struct App {
    locks: lock_runtime::Client,
}

struct Order {
    id: u64,
    shop: u32,
}

// `order_id` is not bound: the parameters bind `app`, `id`, `a`, `b` and `shop`.
#[distributed_lock(key = "order:<order_id>", client = app.locks)]
async fn settle(
    State(app): State<App>,
    Path(id): Path<u64>,
    (a, b, _): (u8, u8, u8),
    Order { shop, .. }: Order,
) {
    let _ = (app, id, a, b, shop);
}

fn main() {}
