//! Hand-off by notification: waiters are woken by the message a release
//! publishes, not by polling.
//!
//! Waiters queue in Redis (see the acquire script). Each queue entry names
//! the waiter's token and a channel of its client, and a release publishes
//! the first live waiter's token on that channel only: one message, to one
//! process, waking one waiter, whatever the number of processes waiting.
//!
//! - On one server, each client (so each process with the global client)
//!   has one pub/sub connection subscribed to its own channel
//!   `lock-waiters:<id>`, opened when its first waiter arrives and kept; it
//!   serves every key its waiters wait on ([`node`]). Over a quorum, one
//!   such connection to each node. With Redis Sentinel, the same on the
//!   primary the sentinels name, moved to the new one after a failover.
//! - On a Redis Cluster, a message published from a script must stay in the
//!   script's slot, and a classic PUBLISH would be broadcast to every node:
//!   a client has one channel per slot its waiters wait in,
//!   `lock-waiters:<id>:{<tag>}` with a tag of that slot, subscribed with
//!   SSUBSCRIBE on the slot's primary and published with SPUBLISH
//!   (sharded pub/sub, Redis 7) ([`cluster`]).
//!
//! Messages can be lost (a reconnect, a failover, a slot migration). Waiters
//! never rely on them alone: each also sleeps at most until the holder's key
//! expires or its place in the queue must be refreshed, and the waiters of
//! a channel are all woken when it is subscribed again.

mod cluster;
mod node;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::ConnectionInfo;
use tokio::sync::Notify;

use crate::error::LockError;
use crate::signal::Signal;
use crate::token::Random;
use crate::transport::cluster::slots;
use crate::transport::Transport;

/// Where a client listens.
pub(crate) enum Listen {
    /// One server: its address, or (for the notifier of a cluster that
    /// falls back to it) seed nodes tried in turn.
    Node(Vec<redis::Client>),
    /// A quorum's independent masters: the client listens on every one of
    /// them (a release goes to every node, so a waiter is woken while any
    /// node that its lock needs is up).
    Quorum(Vec<redis::Client>),
    /// The primary Redis Sentinel names: listened on there, and moved to
    /// the new primary when it changes.
    Sentinel(Arc<super::Sentinels>),
    /// A Redis Cluster, named by its seed nodes (their settings: TLS,
    /// credentials).
    Cluster(Vec<ConnectionInfo>),
}

pub(crate) struct Notifier {
    listen: Listen,
    /// How its connections are opened.
    transport: Transport,
    deadline: Duration,
    /// This client's random id, in its channels' names.
    id: String,
    /// Local waiters, by token: the slot they wait in (0 on one server)
    /// and how to wake them.
    /// A fixed hasher: they are woken in the table's order, which must not
    /// change from one run to the next (a simulation replays its seed).
    waiters: Mutex<Waiters>,
    /// The slots whose channel the connection listens on now (on one
    /// server, slot 0 stands for the client's one channel).
    ready: Signal<Slots>,
    /// On a cluster: the slots whose channel waiters asked for. Kept once
    /// asked (at most one subscription per slot a waiter of this client
    /// ever waited in), so that the next waiter there costs no round trip.
    wanted: Mutex<BTreeSet<u16>>,
    /// Tells the connection task that `wanted` grew.
    kick: Arc<Notify>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The ACL refused the subscription: said once (see [`refused`]).
    refusal_told: AtomicBool,
}

/// Local waiters by token: the slot each waits in, and how to wake it.
type Waiters = HashMap<
    String,
    (u16, Arc<Notify>),
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

/// The slots whose channel the connection listens on, and those it
/// stopped listening on (whose waiters may have missed a message).
#[derive(Default)]
pub(crate) struct Slots {
    listening: HashSet<u16>,
    lost: HashSet<u16>,
}

impl Slots {
    fn contains(&self, slot: &u16) -> bool {
        self.listening.contains(slot)
    }

    /// Returns whether it changed.
    fn insert(&mut self, slot: u16) -> bool {
        self.listening.insert(slot)
    }

    fn lose(&mut self, slot: u16) -> bool {
        let changed = self.listening.remove(&slot);
        self.lost.insert(slot);
        changed
    }

    fn lose_all(&mut self) -> bool {
        let changed = !self.listening.is_empty();
        self.lost.extend(self.listening.drain());
        changed
    }
}

/// A waiter's registration. Dropping it forgets the waiter locally.
pub(crate) struct Subscription {
    notifier: Arc<Notifier>,
    token: String,
    notify: Arc<Notify>,
}

impl Subscription {
    /// A wake-up registered now, so that a message arriving before the
    /// caller starts waiting is not missed.
    pub(crate) fn notified(&self) -> Pin<Box<tokio::sync::futures::OwnedNotified>> {
        let mut notified = Box::pin(Arc::clone(&self.notify).notified_owned());
        notified.as_mut().enable();
        notified
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.notifier.waiters().remove(&self.token);
    }
}

impl Notifier {
    pub(crate) fn new(
        listen: Listen,
        transport: Transport,
        deadline: Duration,
        random: &Random,
    ) -> Result<Arc<Notifier>, LockError> {
        let id = random.random_id()?;
        Ok(Arc::new(Notifier {
            listen,
            transport,
            deadline,
            id,
            waiters: Mutex::new(Waiters::default()),
            ready: Signal::new(Slots::default()),
            wanted: Mutex::new(BTreeSet::new()),
            kick: Arc::new(Notify::new()),
            task: Mutex::new(None),
            refusal_told: AtomicBool::new(false),
        }))
    }

    /// Whether `error` (of a subscription) is the ACL refusing it; the
    /// first time, a warning naming the permission. A refusal is said once
    /// per client, however often the connection task tries again (each
    /// new waiter starts it again): it lasts until the rule changes, and
    /// meanwhile waiters are woken by polling.
    fn refused(&self, error: &redis::RedisError) -> bool {
        if error.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
            return false;
        }
        if !self.refusal_told.swap(true, Ordering::Relaxed) {
            let text = error.to_string();
            let lacks = if text.contains("channel") {
                "the channel pattern `&lock-waiters:*`"
            } else if self.is_cluster() {
                "the command `ssubscribe`"
            } else {
                "the command `subscribe`"
            };
            tracing::warn!(
                %error,
                "the Redis user may not subscribe to this client's waiters' channel: add {lacks} \
                 to its ACL rule; until then its waiters are not woken by releases and poll \
                 instead (at most 500 ms late)"
            );
        }
        true
    }

    fn is_cluster(&self) -> bool {
        matches!(self.listen, Listen::Cluster(_))
    }

    /// Where the waiters of the lock whose keys are in `key`'s slot are
    /// told: the channel to put in their queue entries, and the slot it
    /// stands for (always 0 on one server).
    pub(crate) fn channel_for(&self, key: &str) -> (String, u16) {
        if self.is_cluster() {
            let slot = slots::slot(key);
            (self.channel(slot), slot)
        } else {
            (self.channel(0), 0)
        }
    }

    fn channel(&self, slot: u16) -> String {
        if self.is_cluster() {
            format!("lock-waiters:{}:{{{}}}", self.id, slots::tag(slot))
        } else {
            format!("lock-waiters:{}", self.id)
        }
    }

    /// The slot a channel of this client stands for, if it is one.
    fn slot_of_channel(&self, channel: &[u8]) -> Option<u16> {
        let channel = std::str::from_utf8(channel).ok()?;
        let rest = channel
            .strip_prefix("lock-waiters:")?
            .strip_prefix(&self.id)?;
        if rest.is_empty() {
            return Some(0);
        }
        rest.starts_with(":{").then(|| slots::slot(rest))
    }

    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wanted(&self) -> MutexGuard<'_, BTreeSet<u16>> {
        self.wanted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers the waiter `token` (of `slot`, from [`channel_for`](Self::channel_for))
    /// if the connection is listening on its channel already: no round
    /// trip, and no message can be missed from here on.
    pub(crate) fn join_ready(self: &Arc<Self>, token: &str, slot: u16) -> Option<Subscription> {
        let ready = self.ensure_task() && self.ready.borrow().contains(&slot);
        ready.then(|| self.register(token, slot))
    }

    /// Registers the waiter `token` and waits (at most `patience`, and at
    /// most the call deadline) until the connection listens on its channel.
    /// If it cannot, the registration still works, only without messages:
    /// the waiter then relies on its timed wake-ups.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        token: &str,
        slot: u16,
        patience: Duration,
    ) -> Subscription {
        let subscription = self.register(token, slot);
        if self.is_cluster() {
            // New, or lost and not subscribed again (that happens only
            // while a slot has waiters): the task subscribes it.
            self.wanted().insert(slot);
            self.kick.notify_one();
        }
        if self.ensure_task() {
            let patience = patience.min(self.deadline);
            let _ =
                tokio::time::timeout(patience, self.ready.wait_for(|ready| ready.contains(&slot)))
                    .await;
        }
        subscription
    }

    fn register(self: &Arc<Self>, token: &str, slot: u16) -> Subscription {
        let notify = Arc::clone(
            &self
                .waiters()
                .entry(token.to_owned())
                .or_insert_with(|| (slot, Arc::new(Notify::new())))
                .1,
        );
        Subscription {
            notifier: Arc::clone(self),
            token: token.to_owned(),
            notify,
        }
    }

    /// Starts the connection task if it is not running (first waiter, or
    /// the runtime it ran on has shut down). Returns whether it runs.
    fn ensure_task(self: &Arc<Self>) -> bool {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if task.as_ref().is_some_and(|handle| !handle.is_finished()) {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.ready.send_if_modified(Slots::lose_all);
        let notifier = Arc::downgrade(self);
        *task = Some(match &self.listen {
            Listen::Node(_) | Listen::Sentinel(_) => runtime.spawn(node::run(notifier)),
            Listen::Quorum(nodes) => runtime.spawn(node::run_quorum(notifier, nodes.len())),
            Listen::Cluster(_) => runtime.spawn(cluster::run(notifier)),
        });
        true
    }

    /// Ends the connection task if no waiter is registered (decided under
    /// the task lock: a waiter registering now either is seen here or
    /// finds no task and starts one). Returns whether it ended.
    fn end_task_if_idle(&self) -> bool {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.waiters().is_empty() {
            *task = None;
            return true;
        }
        false
    }

    /// Wakes the waiters named in a message: one token, or several
    /// separated by spaces (the waiters of this client one release wakes
    /// together).
    fn dispatch(&self, tokens: &str) {
        let waiters = self.waiters();
        for token in tokens.split(' ') {
            if let Some((_, notify)) = waiters.get(token) {
                notify.notify_one();
            }
        }
    }

    /// The connection listens on the channel of `slot` now. If it had
    /// stopped listening there, messages may have been lost meanwhile: its
    /// waiters try again.
    fn set_ready(&self, slot: u16) {
        let mut lost = false;
        self.ready.send_if_modified(|slots| {
            lost = slots.lost.remove(&slot);
            slots.insert(slot)
        });
        if lost {
            self.wake(|waiter_slot| waiter_slot == slot);
        }
    }

    /// The connection stopped listening on the channel of `slot` (or of
    /// every slot): its waiters try again now, and again once it is back.
    fn set_lost(&self, slot: Option<u16>) {
        self.ready.send_if_modified(|slots| match slot {
            Some(slot) => slots.lose(slot),
            None => slots.lose_all(),
        });
        self.wake(|waiter_slot| slot.is_none_or(|slot| slot == waiter_slot));
    }

    fn wake(&self, which: impl Fn(u16) -> bool) {
        self.waiters()
            .values()
            .filter(|(slot, _)| which(*slot))
            .for_each(|(_, notify)| notify.notify_one());
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // The task would otherwise wait on a channel nobody publishes to.
        let task = self
            .task
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Waits for `notified` or `pause`, whichever comes first.
pub(crate) async fn wait_for(
    notified: Option<Pin<Box<impl Future<Output = ()>>>>,
    pause: Duration,
) {
    match notified {
        Some(notified) => {
            let _ = tokio::time::timeout(pause, notified).await;
        }
        None => tokio::time::sleep(pause).await,
    }
}
