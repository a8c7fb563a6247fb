//! The connection task of a client on one server: (re)connects, subscribes
//! to the client's channel and dispatches messages. Ends when its client is
//! gone, or when it cannot connect and no waiter is left.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;

use super::{Notifier, Transport};
use crate::backend::connection::within;

/// The pause before connecting again after a failure.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

pub(super) async fn run(notifier: Weak<Notifier>) {
    let mut failures = 0u32;
    let mut seed = 0usize;
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
        let Transport::Node(seeds) = &this.transport else {
            return;
        };
        // After a failure, the next seed node.
        let redis = &seeds[seed % seeds.len()];
        seed += 1;
        let channel = this.channel(0);
        let stream = match within(this.deadline, redis.get_async_pubsub()).await {
            Ok(mut pubsub) => within(this.deadline, pubsub.subscribe(&channel))
                .await
                .map(|()| pubsub.into_on_message()),
            Err(error) => Err(error),
        };
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                if failures == 0 {
                    tracing::warn!(%error, "lock notifications unavailable; waiters fall back to timed retries");
                }
                failures += 1;
                if this.end_task_if_idle() {
                    return;
                }
                drop(this);
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        failures = 0;
        seed -= 1; // stay on the node that works
        this.set_ready(0);
        drop(this);
        while let Some(message) = stream.next().await {
            let Some(this) = notifier.upgrade() else {
                return;
            };
            let tokens: String = message.get_payload().unwrap_or_default();
            this.dispatch(&tokens);
        }
        let Some(this) = notifier.upgrade() else {
            return;
        };
        this.set_lost(None);
        tracing::warn!("lock notifications: connection lost; reconnecting");
    }
}
