// `client =` names a `Client`, not the URL of a Redis.
use lock_runtime::distributed_lock;

struct App {
    redis_url: String,
}

#[distributed_lock(key = "order:<id>", client = app.redis_url)]
async fn settle(app: &App, id: u64) {
    let _ = (app, id);
}

fn main() {}
