// A misspelt argument gets "did you mean"; the parameters the key would
// have used bring no `unused variable` warning beside the error.
use lock_runtime::{distributed_lock, Client, LockError};

struct App {
    locks: Client,
}

#[distributed_lock(key = "report:<day>", tll = "10s", client = app.locks)]
async fn report(app: &App, day: u32) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
