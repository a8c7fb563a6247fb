use lock_runtime::distributed_lock;

struct Pool;

struct App {
    pool: Pool,
}

#[distributed_lock(key = "order:<id>", client = app.pool)]
async fn settle(app: App, id: u64) {
    let _ = (app.pool, id);
}

fn main() {}
