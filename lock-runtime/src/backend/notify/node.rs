//! The connection task of a client on one server, on every node of a
//! quorum, or on the primary Redis Sentinel names (moved with it):
//! (re)connects, subscribes to the client's channel and dispatches
//! messages. Ends when its client is gone, or when it cannot connect and no
//! waiter is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Listen, Notifier};
use crate::transport::within;

/// The pause before connecting again after a failure.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

/// On one server (seed nodes tried in turn after a failure).
pub(super) async fn run(notifier: Weak<Notifier>) {
    listen(notifier, None).await;
}

/// On every node of a quorum at once: the channel counts as listened to
/// while at least one node's subscription is up (a release goes to every
/// node). Ends, with every node's subscription, when one of them finds no
/// waiter left.
pub(super) async fn run_quorum(notifier: Weak<Notifier>, nodes: usize) {
    let listening = Arc::new(AtomicUsize::new(0));
    let loops = (0..nodes).map(|node| {
        Box::pin(listen(
            notifier.clone(),
            Some((node, Arc::clone(&listening))),
        ))
    });
    futures_util::future::select_all(loops).await;
}

/// Listens on one server (`quorum`: node `.0` of a quorum, where `.1`
/// counts the nodes listened on).
async fn listen(notifier: Weak<Notifier>, quorum: Option<(usize, Arc<AtomicUsize>)>) {
    let mut failures = 0u32;
    let mut seed = 0usize;
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
        // With Sentinel: the primary it names now, and its epoch (the
        // subscription moves when it changes).
        let mut sentinel = None;
        let redis = match (&this.listen, &quorum) {
            (Listen::Quorum(nodes), Some((node, _))) => Ok(nodes[*node].clone()),
            // After a failure, the next seed node.
            (Listen::Node(seeds), None) => Ok(seeds[seed % seeds.len()].clone()),
            (Listen::Sentinel(sentinels), None) => within(this.deadline, sentinels.primary())
                .await
                .map(|(epoch, primary)| {
                    sentinel = Some((Arc::clone(sentinels), epoch));
                    primary
                }),
            _ => return,
        };
        seed += 1;
        let channel = this.channel(0);
        let stream = match redis {
            Ok(redis) => match within(this.deadline, this.transport.pubsub(&redis)).await {
                Ok(mut pubsub) => within(this.deadline, pubsub.subscribe(&channel))
                    .await
                    .map(|()| pubsub.into_messages()),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        if let (Err(_), Some((sentinels, epoch))) = (&stream, &sentinel) {
            sentinels.suspect(*epoch);
        }
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                if failures == 0 && !this.refused(&error) {
                    match &quorum {
                        Some((node, _)) => {
                            tracing::warn!(%error, node, "lock notifications unavailable from a quorum node; its releases do not wake waiters until it is back")
                        }
                        None => {
                            tracing::warn!(%error, "lock notifications unavailable; waiters fall back to timed retries")
                        }
                    }
                }
                failures += 1;
                // Over a quorum the task ends only when no node is listened
                // on (the others' messages still come).
                let listened = quorum
                    .as_ref()
                    .is_some_and(|(_, listening)| listening.load(Ordering::SeqCst) > 0);
                if !listened && this.end_task_if_idle() {
                    return;
                }
                drop(this);
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        failures = 0;
        seed -= 1; // stay on the node that works
        match &quorum {
            // The first node listened on: messages can arrive again.
            Some((_, listening)) => {
                if listening.fetch_add(1, Ordering::SeqCst) == 0 {
                    this.set_ready(0);
                }
            }
            None => this.set_ready(0),
        }
        drop(this);
        let mut changes = sentinel.as_ref().map(|(sentinels, _)| sentinels.changes());
        let mut moved = false;
        loop {
            let message = match (&mut changes, &sentinel) {
                // A new primary: listened on there instead.
                // Biased (deterministic under a simulation): a message
                // that came first is dispatched before the move.
                (Some(changes), Some((_, epoch))) => tokio::select! {
                    biased;
                    message = stream.next() => message,
                    _ = changes.wait_for(|now| now != epoch) => {
                        moved = true;
                        None
                    }
                },
                _ => stream.next().await,
            };
            let Some(message) = message else {
                break;
            };
            let Some(this) = notifier.upgrade() else {
                return;
            };
            let tokens: String = message.get_payload().unwrap_or_default();
            this.dispatch(&tokens);
        }
        if let (false, Some((sentinels, epoch))) = (moved, &sentinel) {
            // The connection closed: the primary may be gone.
            sentinels.suspect(*epoch);
        }
        let Some(this) = notifier.upgrade() else {
            return;
        };
        if moved {
            this.set_lost(None);
            tracing::info!("lock notifications: moving to the new primary");
            continue;
        }
        match &quorum {
            Some((node, listening)) => {
                // The other nodes' messages still come, unless this was the
                // last node listened on.
                if listening.fetch_sub(1, Ordering::SeqCst) == 1 {
                    this.set_lost(None);
                }
                tracing::warn!(
                    node,
                    "lock notifications: connection to a quorum node lost; reconnecting"
                );
            }
            None => {
                this.set_lost(None);
                tracing::warn!("lock notifications: connection lost; reconnecting");
            }
        }
    }
}
