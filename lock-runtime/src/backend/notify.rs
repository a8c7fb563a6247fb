//! Hand-off by notification: waiters are woken by the message a release
//! publishes, not by polling.
//!
//! Waiters queue in Redis (see the acquire script). Each queue entry names
//! the waiter's token and the channel of its client, and a release publishes
//! the first live waiter's token on that client's channel only: one message,
//! to one process, waking one waiter, whatever the number of processes
//! waiting. Each client (so each process with the global client) has one
//! pub/sub connection subscribed to its own channel, opened when its first
//! waiter arrives and kept; it serves every key its waiters wait on.
//!
//! Messages can be lost (a reconnect). Waiters never rely on them alone:
//! each also sleeps at most until the holder's key expires or its place in
//! the queue must be refreshed, and all are woken after a reconnect.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{watch, Notify};

use super::connection::within;
use crate::error::LockError;
use crate::token::new_token;

pub(crate) struct Notifier {
    /// Where to subscribe: the server, or a cluster's seed nodes, tried in
    /// turn (a published message reaches every node of a cluster).
    seeds: Vec<redis::Client>,
    deadline: Duration,
    /// This client's channel: `lock-waiters:<random id>`.
    channel: String,
    /// Local waiters, by token.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Whether the connection is subscribed to the channel now.
    ready: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
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
        seeds: Vec<redis::Client>,
        deadline: Duration,
    ) -> Result<Arc<Notifier>, LockError> {
        let id = new_token()?;
        Ok(Arc::new(Notifier {
            seeds,
            deadline,
            channel: format!("lock-waiters:{id}"),
            waiters: Mutex::new(HashMap::new()),
            ready: watch::Sender::new(false),
            task: Mutex::new(None),
        }))
    }

    /// The channel this client's waiters are told on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    fn waiters(&self) -> MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers the waiter `token` if the connection is listening already:
    /// no round trip, and no message can be missed from here on.
    pub(crate) fn join_ready(self: &Arc<Self>, token: &str) -> Option<Subscription> {
        let alive = self.ensure_task();
        (alive && *self.ready.borrow()).then(|| self.register(token))
    }

    /// Registers the waiter `token` and waits (at most `patience`, and at
    /// most the call deadline) until the connection listens. If it cannot,
    /// the registration still works, only without messages: the waiter then
    /// relies on its timed wake-ups.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        token: &str,
        patience: Duration,
    ) -> Subscription {
        let subscription = self.register(token);
        if self.ensure_task() {
            let mut ready = self.ready.subscribe();
            let patience = patience.min(self.deadline);
            let _ = tokio::time::timeout(patience, ready.wait_for(|ready| *ready)).await;
        }
        subscription
    }

    fn register(self: &Arc<Self>, token: &str) -> Subscription {
        let notify = Arc::clone(
            self.waiters()
                .entry(token.to_owned())
                .or_insert_with(|| Arc::new(Notify::new())),
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
        self.ready.send_replace(false);
        *task = Some(runtime.spawn(run(Arc::downgrade(self))));
        true
    }

    fn dispatch(&self, token: &str) {
        if let Some(notify) = self.waiters().get(token) {
            notify.notify_one();
        }
    }

    /// After a reconnect, messages may have been lost: every waiter retries.
    fn wake_all(&self) {
        self.waiters()
            .values()
            .for_each(|notify| notify.notify_one());
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

/// The connection task: (re)connects, subscribes to the client's channel and
/// dispatches messages. Ends when its client is gone.
async fn run(notifier: Weak<Notifier>) {
    let mut failures = 0u32;
    let mut seed = 0usize;
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
        // After a failure, the next seed node.
        let redis = &this.seeds[seed % this.seeds.len()];
        seed += 1;
        let stream = match within(this.deadline, redis.get_async_pubsub()).await {
            Ok(mut pubsub) => within(this.deadline, pubsub.subscribe(&this.channel))
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
                {
                    // Decided under the task lock: a waiter registering now
                    // either is seen here or finds no task and starts one.
                    let mut task = this
                        .task
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    if this.waiters().is_empty() {
                        *task = None;
                        return;
                    }
                }
                drop(this);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        failures = 0;
        seed -= 1; // stay on the node that works
        this.ready.send_replace(true);
        this.wake_all();
        drop(this);
        while let Some(message) = stream.next().await {
            let Some(this) = notifier.upgrade() else {
                return;
            };
            // One token, or several separated by spaces (the waiters of
            // this client one release wakes together).
            let tokens: String = message.get_payload().unwrap_or_default();
            tokens.split(' ').for_each(|token| this.dispatch(token));
        }
        let Some(this) = notifier.upgrade() else {
            return;
        };
        this.ready.send_replace(false);
        tracing::warn!("lock notifications: connection lost; reconnecting");
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
