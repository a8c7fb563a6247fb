//! Hand-off by notification: waiters are woken by the message a release
//! publishes, not by polling.
//!
//! One pub/sub connection per client (so one per process with the global
//! client) serves every key its waiters wait on. A key's channel is
//! subscribed when its first local waiter arrives and unsubscribed when the
//! last one leaves. A release publishes `*` (wake one waiter, whoever it is)
//! or, in fair mode, the token of the waiter whose turn it is. Each process
//! wakes one local waiter per `*` message, so a release sends one attempt
//! per waiting process, not one per waiting task.
//!
//! Messages can be lost (a reconnect). Waiters never rely on them alone:
//! each also sleeps at most until the holder's key expires (or, in fair mode,
//! until it must refresh its place), and all are woken after a reconnect.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::client::within;

/// Waiters of one channel in this process.
#[derive(Default)]
struct Channel {
    /// Woken (one at a time) by a `*` message.
    any: Arc<Notify>,
    /// Fair waiters, woken by their own token.
    by_token: HashMap<String, Arc<Notify>>,
    /// Local waiters on this channel.
    waiters: usize,
}

enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

pub(crate) struct Notifier {
    redis: redis::Client,
    deadline: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    task: Mutex<Option<(mpsc::UnboundedSender<Command>, tokio::task::JoinHandle<()>)>>,
}

/// A waiter's interest in one channel. Dropping it leaves the channel.
pub(crate) struct Subscription {
    notifier: Arc<Notifier>,
    channel: String,
    token: Option<String>,
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
        let mut channels = self.notifier.channels();
        let Some(channel) = channels.get_mut(&self.channel) else {
            return;
        };
        if let Some(token) = &self.token {
            channel.by_token.remove(token);
        }
        channel.waiters -= 1;
        if channel.waiters == 0 {
            channels.remove(&self.channel);
            drop(channels);
            self.notifier
                .send(Command::Unsubscribe(self.channel.clone()));
        }
    }
}

impl Notifier {
    pub(crate) fn new(redis: redis::Client, deadline: Duration) -> Arc<Notifier> {
        Arc::new(Notifier {
            redis,
            deadline,
            channels: Mutex::new(HashMap::new()),
            task: Mutex::new(None),
        })
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Joins `channel` as a waiter (a fair one when `token` is given) and
    /// makes sure the channel is subscribed. If subscribing fails, the
    /// subscription still works, only without messages: waiters then rely
    /// on their timed wake-ups.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
        token: Option<&str>,
    ) -> Subscription {
        let notify = {
            let mut channels = self.channels();
            let entry = channels.entry(channel.to_owned()).or_default();
            entry.waiters += 1;
            match token {
                Some(token) => Arc::clone(
                    entry
                        .by_token
                        .entry(token.to_owned())
                        .or_insert_with(|| Arc::new(Notify::new())),
                ),
                None => Arc::clone(&entry.any),
            }
        };
        let subscription = Subscription {
            notifier: Arc::clone(self),
            channel: channel.to_owned(),
            token: token.map(str::to_owned),
            notify,
        };
        let (ack, acked) = oneshot::channel();
        self.send(Command::Subscribe(channel.to_owned(), ack));
        let _ = tokio::time::timeout(self.deadline, acked).await;
        subscription
    }

    fn send(self: &Arc<Self>, command: Command) {
        let mut task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let alive = task
            .as_ref()
            .is_some_and(|(_, handle)| !handle.is_finished());
        if !alive {
            if matches!(command, Command::Unsubscribe(_)) {
                return; // no connection, nothing subscribed
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let (sender, receiver) = mpsc::unbounded_channel();
            let handle = runtime.spawn(run(Arc::downgrade(self), receiver));
            *task = Some((sender, handle));
        }
        if let Some((sender, _)) = task.as_ref() {
            let _ = sender.send(command);
        }
    }

    /// Delivers one published message.
    fn dispatch(&self, channel: &str, payload: &str) {
        let channels = self.channels();
        let Some(channel) = channels.get(channel) else {
            return;
        };
        if payload == "*" {
            channel.any.notify_one();
        } else if let Some(notify) = channel.by_token.get(payload) {
            notify.notify_one();
        }
    }

    /// After a reconnect, messages may have been lost: every waiter retries.
    fn wake_all(&self) {
        for channel in self.channels().values() {
            channel.any.notify_waiters();
            for notify in channel.by_token.values() {
                notify.notify_one();
            }
        }
    }

    fn subscribed_channels(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }
}

/// The connection task: (re)connects, (un)subscribes in the order asked,
/// and dispatches messages. Ends when its client is gone.
async fn run(notifier: Weak<Notifier>, mut commands: mpsc::UnboundedReceiver<Command>) {
    loop {
        let Some(this) = notifier.upgrade() else {
            return;
        };
        let connected = within(this.deadline, this.redis.get_async_pubsub()).await;
        let (mut sink, mut stream) = match connected {
            Ok(pubsub) => pubsub.split(),
            Err(error) => {
                tracing::warn!(%error, "lock notifications: cannot connect; waiters fall back to timed retries");
                drop(this);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut subscribed = HashSet::new();
        for channel in this.subscribed_channels() {
            if within(this.deadline, sink.subscribe(&channel))
                .await
                .is_ok()
            {
                subscribed.insert(channel);
            }
        }
        this.wake_all();
        drop(this);
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(this) = notifier.upgrade() else { return };
                    match command {
                        None => return,
                        Some(Command::Subscribe(channel, ack)) => {
                            if !subscribed.contains(&channel)
                                && within(this.deadline, sink.subscribe(&channel)).await.is_ok()
                            {
                                subscribed.insert(channel);
                            }
                            let _ = ack.send(());
                        }
                        Some(Command::Unsubscribe(channel)) => {
                            let unused = !this.channels().contains_key(&channel);
                            if unused && subscribed.remove(&channel) {
                                let _ = within(this.deadline, sink.unsubscribe(&channel)).await;
                            }
                        }
                    }
                }
                message = stream.next() => {
                    let Some(this) = notifier.upgrade() else { return };
                    match message {
                        Some(message) => {
                            let payload: String = message.get_payload().unwrap_or_default();
                            this.dispatch(message.get_channel_name(), &payload);
                        }
                        None => {
                            tracing::warn!("lock notifications: connection lost; reconnecting");
                            break;
                        }
                    }
                }
            }
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
