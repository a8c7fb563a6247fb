//! The connection task of a client on a Redis Cluster: one RESP3 cluster
//! connection (its own, apart from the lock calls') subscribed with
//! SSUBSCRIBE to the channel of every slot the client's waiters asked for,
//! each on the primary of its slot.
//!
//! The `redis` crate resubscribes after a reconnect and after a topology
//! change; this task does not rely on it alone. Whatever the server says
//! is what counts: a confirmation (`ssubscribe`) makes a slot ready, and a
//! `sunsubscribe` the server sends (the slot migrated, or its primary
//! became a replica) or a lost connection makes it not ready, wakes its
//! waiters (a message may have been lost) and has it subscribed again
//! (only while it has waiters) after [`RETRY_PAUSE`], doubled after each
//! failure up to [`MAX_RETRY_PAUSE`], until a confirmation comes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::{Notifier, Transport};
use crate::transport::within;

/// The pause before connecting or subscribing again after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause between tries of a subscription that keeps failing.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

pub(super) async fn run(notifier: Weak<Notifier>) {
    let Some(this) = notifier.upgrade() else {
        return;
    };
    let Transport::Cluster {
        seeds,
        connect_timeout,
        #[cfg(feature = "tls-rustls")]
        tls,
    } = &this.transport
    else {
        return;
    };
    let (sender, mut pushes) = mpsc::unbounded_channel();
    let builder = ClusterClientBuilder::new(seeds.iter().cloned());
    #[cfg(feature = "tls-rustls")]
    let builder = match tls {
        Some(certificates) => builder.certs(certificates.clone()),
        None => builder,
    };
    let client = builder
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(sender)
        .connection_timeout(*connect_timeout)
        .response_timeout(this.deadline)
        // A subscription sent to a node that no longer serves the slot is
        // redirected (MOVED) after a refresh of the slot map.
        .retries(3)
        .build();
    let client = match client {
        Ok(client) => client,
        Err(error) => {
            // Cannot happen: the lock calls' client was built from the same seeds.
            tracing::warn!(%error, "lock notifications unavailable; waiters fall back to timed retries");
            return;
        }
    };
    let kick = Arc::clone(&this.kick);
    drop(this);
    let warned = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicU64::new(0));
    let mut connection: Option<ClusterConnection> = None;
    let mut subscribing: Option<tokio::task::JoinHandle<()>> = None;
    // Whether the slots to subscribe may have changed since the last look.
    let mut dirty = true;
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
        if connection.is_none() {
            match within(this.deadline, client.get_async_connection()).await {
                Ok(opened) => connection = Some(opened),
                Err(error) => {
                    if !warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(%error, "lock notifications unavailable; waiters fall back to timed retries");
                    }
                    if this.end_task_if_idle() {
                        return;
                    }
                }
            }
        }
        if let Some(connection) = &connection {
            if dirty && subscribing.as_ref().is_none_or(|task| task.is_finished()) {
                dirty = false;
                // The slots asked for that are not listened on, and only
                // those that have waiters now: a slot whose waiters are
                // gone is subscribed again by its next waiter.
                let missing: Vec<u16> = {
                    let ready = this.ready.borrow();
                    let waited_in: HashSet<u16> =
                        this.waiters().values().map(|(slot, _)| *slot).collect();
                    let wanted = this.wanted();
                    wanted
                        .iter()
                        .filter(|slot| !ready.contains(slot) && waited_in.contains(slot))
                        .copied()
                        .collect()
                };
                if !missing.is_empty() {
                    subscribing = Some(tokio::spawn(subscribe_slots(
                        Weak::clone(&notifier),
                        connection.clone(),
                        missing,
                        Arc::clone(&warned),
                        Arc::clone(&pause),
                    )));
                }
            }
        }
        drop(this);
        tokio::select! {
            push = pushes.recv() => match push {
                Some(push) => match notifier.upgrade() {
                    Some(this) => dirty |= handle(&this, push),
                    None => return,
                },
                None => return, // cannot happen: `client` holds the sender
            },
            () = kick.notified() => dirty = true,
            () = tokio::time::sleep(RETRY_PAUSE), if connection.is_none() => dirty = true,
        }
    }
}

/// Subscribes to the channels of `slots` (one call per slot: a command's
/// channels must share a slot), then has the task look again. A slot is
/// ready when the server's confirmation comes through the push channel, in
/// order with the `sunsubscribe` that may follow it; not when the call
/// returns (a confirmation and a later `sunsubscribe` may both be in by
/// then). After a failure, the pause before the next try doubles, from
/// [`RETRY_PAUSE`] to [`MAX_RETRY_PAUSE`].
async fn subscribe_slots(
    notifier: Weak<Notifier>,
    connection: ClusterConnection,
    slots: Vec<u16>,
    warned: Arc<AtomicBool>,
    pause: Arc<AtomicU64>,
) {
    let Some(this) = notifier.upgrade() else {
        return;
    };
    let deadline = this.deadline;
    let kick = Arc::clone(&this.kick);
    let calls: Vec<_> = slots
        .iter()
        .map(|&slot| {
            let mut connection = connection.clone();
            let channel = this.channel(slot);
            async move { within(deadline, connection.ssubscribe(channel)).await }
        })
        .collect();
    drop(this);
    let failed = join_all(calls).await.into_iter().find_map(Result::err);
    match failed {
        Some(error) => {
            let refused = notifier.upgrade().is_some_and(|this| this.refused(&error));
            if !refused && !warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "lock notifications: cannot subscribe; waiters fall back to timed retries until it can");
            }
            let last = pause.load(Ordering::Relaxed);
            let next = if last == 0 {
                RETRY_PAUSE.as_millis() as u64
            } else {
                (last * 2).min(MAX_RETRY_PAUSE.as_millis() as u64)
            };
            pause.store(next, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(next)).await;
        }
        None => {
            warned.store(false, Ordering::Relaxed);
            pause.store(0, Ordering::Relaxed);
        }
    }
    kick.notify_one();
}

/// What the server pushed: a message, or a change of subscriptions.
/// Returns whether slots were lost (to be subscribed again).
fn handle(this: &Notifier, push: PushInfo) -> bool {
    let channel = match push.data.first() {
        Some(Value::BulkString(channel)) => this.slot_of_channel(channel),
        _ => None,
    };
    match (push.kind, channel) {
        (PushKind::SMessage | PushKind::Message, Some(_)) => {
            if let Some(Value::BulkString(tokens)) = push.data.get(1) {
                this.dispatch(&String::from_utf8_lossy(tokens));
            }
            false
        }
        (PushKind::SSubscribe, Some(slot)) => {
            this.set_ready(slot);
            false
        }
        (PushKind::SUnsubscribe, Some(slot)) => {
            tracing::debug!(
                slot,
                "lock notifications: the server unsubscribed a slot; subscribing again"
            );
            this.set_lost(Some(slot));
            true
        }
        (PushKind::Disconnection, _) => {
            tracing::debug!("lock notifications: a cluster connection was lost; subscribing again");
            this.set_lost(None);
            true
        }
        _ => false,
    }
}
