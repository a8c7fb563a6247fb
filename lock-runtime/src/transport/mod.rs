//! How the client reaches Redis: connections to one node (`node`), a Redis
//! Cluster's nodes by its slot map (`cluster`), the primary Redis Sentinel
//! names (`sentinel`).

pub(crate) mod cluster;
pub(crate) mod node;
pub(crate) mod sentinel;

use std::future::Future;
use std::time::Duration;

/// The error of a call that got no answer within `deadline`.
pub(crate) fn timed_out(deadline: Duration) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {deadline:?}"),
    )
    .into()
}

/// Runs one Redis call, failing with an I/O `TimedOut` error when it takes
/// longer than `deadline`.
pub(crate) async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result,
        Err(_elapsed) => Err(timed_out(deadline)),
    }
}
