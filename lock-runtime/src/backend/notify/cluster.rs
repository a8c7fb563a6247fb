//! The connection task of a client on a Redis Cluster: its own RESP3
//! connection to each primary (apart from the lock calls'), found by its
//! own slot map (`transport::cluster::Router`), subscribed with SSUBSCRIBE
//! to the channel of every slot the client's waiters asked for, each on the
//! primary of its slot. Its connections are opened through the client's
//! transport, like every other (TCP, or the simulated network).
//!
//! Whatever the server says is what counts: a confirmation (`ssubscribe`)
//! makes a slot ready, and a `sunsubscribe` the server sends (the slot
//! migrated, or its primary became a replica) or a lost connection makes it
//! not ready, wakes its waiters (a message may have been lost) and has it
//! subscribed again (only while it has waiters), at once and then, after a
//! failure, after [`RETRY_PAUSE`], doubled after each failure up to
//! [`MAX_RETRY_PAUSE`], until a confirmation comes. Nothing is resubscribed
//! behind its back (the `redis` crate's cluster client, used before, did
//! that after a reconnect; it was never relied on).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use redis::{ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc;

use super::{Listen, Notifier};
use crate::error::retryable;
use crate::transport::cluster::Router;
use crate::transport::within;

/// The pause before connecting or subscribing again after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause between tries of a subscription that keeps failing.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);
/// Tries of one subscription, the slot map fetched again between them
/// when it proved stale (a `MOVED`, a node gone).
const TRIES: u32 = 3;

pub(super) async fn run(notifier: Weak<Notifier>) {
    let Some(this) = notifier.upgrade() else {
        return;
    };
    let Listen::Cluster(seeds) = &this.listen else {
        return;
    };
    let (sender, mut pushes) = mpsc::unbounded_channel();
    // RESP3: a node's subscriptions, their confirmations and messages come
    // as pushes on its command connection, each sent to `sender`, with a
    // `Disconnection` when a connection closes.
    let seeds = seeds
        .iter()
        .map(|seed| {
            let settings = seed
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            seed.clone().set_redis_settings(settings)
        })
        .collect();
    let router = Arc::new(Router::new(
        seeds,
        this.transport.with_pushes(sender),
        this.deadline,
        None,
    ));
    let kick = Arc::clone(&this.kick);
    drop(this);
    let warned = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicU64::new(0));
    let mut subscribing: Option<tokio::task::JoinHandle<()>> = None;
    // Whether the slots to subscribe may have changed since the last look.
    let mut dirty = true;
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
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
                    Arc::clone(&router),
                    missing,
                    Arc::clone(&warned),
                    Arc::clone(&pause),
                )));
            }
        }
        drop(this);
        // Biased: what the server said first, in its order.
        tokio::select! {
            biased;
            push = pushes.recv() => match push {
                Some(push) => match notifier.upgrade() {
                    Some(this) => dirty |= handle(&this, push),
                    None => return,
                },
                None => return, // cannot happen: `router` holds the sender
            },
            () = kick.notified() => dirty = true,
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
    router: Arc<Router>,
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
            let router = Arc::clone(&router);
            let channel = this.channel(slot);
            async move { within(deadline, ssubscribe(&router, &channel)).await }
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

/// `SSUBSCRIBE channel` on the primary of the channel's slot (its name's
/// hash tag); tried again, by the slot map fetched again, when the map
/// proved stale (a `MOVED`, a node that cannot be reached). Whether the
/// slot is listened on is told by the confirmation the server pushes.
async fn ssubscribe(router: &Router, channel: &str) -> RedisResult<()> {
    let mut command = redis::cmd("SSUBSCRIBE");
    command.arg(channel);
    let mut tries = 1;
    loop {
        match router.send(&command).await {
            Ok(_) => return Ok(()),
            Err(error) if tries < TRIES && retryable(&error) => tries += 1,
            Err(error) => return Err(error),
        }
    }
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
