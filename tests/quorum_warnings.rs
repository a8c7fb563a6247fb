//! RedLock: a node's failures that the quorum carried are not returned,
//! so they are logged. Its own test binary: the capturing subscriber is
//! this thread's default, and tests of other binaries' threads must not
//! race it for the log callsites' interest.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::Lock;

/// Warnings and errors seen by a subscriber.
#[derive(Clone, Default)]
struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {:?}", event.metadata().level(), event));
        }
    }
}

/// One node of 3 is down for good (connection refused). Every acquire,
/// renewal and release succeeds on the other two; the node's failures,
/// not returned, are logged (a warning), so the operator learns the quorum
/// now survives no further failure.
/// (A current-thread runtime: every task of the client runs on this thread,
/// under this test's subscriber.)
#[tokio::test]
async fn a_node_that_is_down_is_reported_somewhere() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    nodes[2].kill();
    let client = quorum_client(&nodes);
    for _ in 0..3 {
        let guard = Lock::new("down")
            .ttl(Duration::from_millis(300))
            .renew()
            .fencing()
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await; // renewed
        assert!(guard.is_held());
        guard.release().await.unwrap();
    }
    let seen = warnings.0.lock().unwrap().clone();
    assert!(
        !seen.is_empty(),
        "node 2 refused every call, yet nothing was returned or logged"
    );
}
