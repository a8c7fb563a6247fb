//! Hand-off by notification: waiters are woken by the message a release
//! publishes, not by polling.
//!
//! One pub/sub connection per client (so one per process with the global
//! client) serves every key its waiters wait on. A key's channel is
//! subscribed when its first local waiter arrives, and unsubscribed a
//! second after the last one left (so a busy key is not subscribed and
//! unsubscribed for every waiter). Waiters queue in Redis; a release
//! publishes the token of the first live waiter, and only that waiter wakes
//! and tries: one attempt per release, whichever process it is in. (`*`, sent
//! when nobody queues, wakes every local waiter of the key.)
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

/// How long a channel stays subscribed after its last local waiter left.
const LINGER: Duration = Duration::from_secs(1);

/// Waiters of one channel in this process.
#[derive(Default)]
struct Channel {
    /// Each waiter, woken by its own token.
    by_token: HashMap<String, Arc<Notify>>,
    /// Local waiters on this channel.
    waiters: usize,
    /// Whether the connection is subscribed to it now.
    subscribed: bool,
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
        let mut channels = self.notifier.channels();
        let Some(channel) = channels.get_mut(&self.channel) else {
            return;
        };
        channel.by_token.remove(&self.token);
        channel.waiters -= 1;
        if channel.waiters == 0 {
            drop(channels);
            // Unsubscribed later if it is still unused then.
            let (notifier, channel) = (Arc::clone(&self.notifier), self.channel.clone());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    tokio::time::sleep(LINGER).await;
                    notifier.send(Command::Unsubscribe(channel));
                });
            }
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

    /// Joins `channel` as the waiter `token`, if the channel is subscribed
    /// already (a waiter left less than a second ago, or others wait): no
    /// round trip, and no message can be missed from here on.
    pub(crate) fn join_subscribed(
        self: &Arc<Self>,
        channel: &str,
        token: &str,
    ) -> Option<Subscription> {
        let mut channels = self.channels();
        let entry = channels.get_mut(channel).filter(|entry| entry.subscribed)?;
        Some(self.register(entry, channel, token))
    }

    /// Joins `channel` as the waiter `token` and makes sure the channel is
    /// subscribed. If subscribing fails, the subscription still works, only
    /// without messages: waiters then rely on their timed wake-ups.
    pub(crate) async fn subscribe(self: &Arc<Self>, channel: &str, token: &str) -> Subscription {
        let subscription = {
            let mut channels = self.channels();
            let entry = channels.entry(channel.to_owned()).or_default();
            self.register(entry, channel, token)
        };
        let (ack, acked) = oneshot::channel();
        self.send(Command::Subscribe(channel.to_owned(), ack));
        let _ = tokio::time::timeout(self.deadline, acked).await;
        subscription
    }

    fn register(self: &Arc<Self>, entry: &mut Channel, channel: &str, token: &str) -> Subscription {
        entry.waiters += 1;
        let notify = Arc::clone(
            entry
                .by_token
                .entry(token.to_owned())
                .or_insert_with(|| Arc::new(Notify::new())),
        );
        Subscription {
            notifier: Arc::clone(self),
            channel: channel.to_owned(),
            token: token.to_owned(),
            notify,
        }
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
            channel
                .by_token
                .values()
                .for_each(|notify| notify.notify_one());
        } else if let Some(notify) = channel.by_token.get(payload) {
            notify.notify_one();
        }
    }

    /// After a reconnect, messages may have been lost: every waiter retries.
    fn wake_all(&self) {
        for channel in self.channels().values() {
            channel
                .by_token
                .values()
                .for_each(|notify| notify.notify_one());
        }
    }

    /// Marks `channel` subscribed (or not) on the current connection.
    fn set_subscribed(&self, channel: &str, subscribed: bool) {
        if let Some(entry) = self.channels().get_mut(channel) {
            entry.subscribed = subscribed;
        }
    }

    /// A new connection: nothing is subscribed on it yet.
    fn channels_to_resubscribe(&self) -> Vec<String> {
        let mut channels = self.channels();
        channels.retain(|_, channel| channel.waiters > 0);
        channels
            .values_mut()
            .for_each(|channel| channel.subscribed = false);
        channels.keys().cloned().collect()
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
        for channel in this.channels_to_resubscribe() {
            if within(this.deadline, sink.subscribe(&channel))
                .await
                .is_ok()
            {
                this.set_subscribed(&channel, true);
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
                                subscribed.insert(channel.clone());
                            }
                            this.set_subscribed(&channel, subscribed.contains(&channel));
                            let _ = ack.send(());
                        }
                        Some(Command::Unsubscribe(channel)) => {
                            let unused = {
                                let mut channels = this.channels();
                                let unused = channels.get(&channel).is_none_or(|c| c.waiters == 0);
                                if unused {
                                    channels.remove(&channel);
                                }
                                unused
                            };
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
