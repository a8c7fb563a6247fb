//! RedLock: a node's failures that the quorum carried are not returned,
//! so they are logged. Its own test binary: the capturing subscriber is
//! this thread's default, and tests of other binaries' threads must not
//! race it for the log callsites' interest.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};

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
/// not returned, are logged (a warning naming the node), so the operator
/// learns the quorum now survives no further failure.
/// (A current-thread runtime: every task of the client runs on this thread,
/// under this test's subscriber.)
#[tokio::test]
async fn a_node_that_is_down_is_reported_somewhere() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let down = format!("127.0.0.1:{}", nodes[2].port());
    nodes[2].kill();
    // Generous timeouts for a loaded machine: the node that is down
    // refuses connections at once.
    let client = Client::new(
        Config::new(quorum_url(&nodes))
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    open_connections(&client, &nodes[..2]).await;
    // A quorum lock is valid for its ttl less the time its acquisition
    // took, and each node gets a tenth of the ttl (at most 500 ms) to
    // answer it: 5 s leaves room for a loaded machine.
    let ttl = Duration::from_secs(5);
    for _ in 0..3 {
        let guard = Lock::new("down")
            .ttl(ttl)
            .renew()
            .fencing()
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap();
        // Renewed: a renewal sent after it was taken is confirmed by the
        // two nodes that are up (its validity reaches past `taken + ttl`,
        // less the 1 % + 2 ms drift margin).
        let taken = Instant::now();
        wait_until_async("the lock is renewed", LINE_TIMEOUT, || {
            assert!(
                guard.is_held(),
                "lost {:?} after it was taken: {:?}; {:?}",
                taken.elapsed(),
                guard.lost_cause(),
                client.renewal_stats()
            );
            let margin = ttl / 100 + Duration::from_millis(2);
            Instant::now() + guard.remaining() >= taken + ttl - margin
        })
        .await;
        guard.release().await.unwrap();
    }
    // Logged as it happens, or by a release's background task for a node
    // that missed it.
    wait_until_async("node 2's failures are logged", LINE_TIMEOUT, || {
        warnings
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|warning| warning.contains("a quorum node failed") && warning.contains(&down))
    })
    .await;
}
