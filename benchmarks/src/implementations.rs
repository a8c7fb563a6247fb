//! The lock implementations the comparison runs, behind one small interface.

use std::time::Duration;

use lock_runtime::{distributed_lock, Client, Config, Lock, LockError, LockGuard, RwLock};
use redis::aio::MultiplexedConnection;

/// What is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// This project, manual API, each contender its own client.
    Manual,
    /// This project, manual API, `fair`.
    ManualFair,
    /// This project, manual API, `acquire` with a wait (the handler form),
    /// in the uncontended workloads.
    ManualWait,
    /// [`Kind::ManualWait`] with one client for all the tasks of a process
    /// (as the attribute's process-wide client): its tasks waiting for one
    /// key queue in the process and pass the lock on (`redlock-degraded`).
    ManualWaitShared,
    /// This project, the read side of an `RwLock` (manual API, W1).
    ManualRead,
    /// This project, the write side of an `RwLock` (manual API, W1).
    ManualWrite,
    /// This project, the attribute (process-wide client).
    Attribute,
    /// This project, the attribute with `wait = "2s"`, in the uncontended
    /// workloads.
    AttributeWait,
    /// The same operations written directly with the `redis` crate: SET NX PX,
    /// EVALSHA compare-and-delete; when busy, retry after 1 ms.
    HandWritten,
    /// rslock with its defaults (3 tries, 0–200 ms random delay, then again).
    Rslock,
    /// rslock with its smallest retry delay (1 ms).
    RslockFast,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Manual => "this project, manual API",
            Kind::ManualFair => "this project, manual API, fair",
            Kind::ManualWait => "this project, manual API, wait",
            Kind::ManualWaitShared => "this project, manual API, wait, one client per process",
            Kind::ManualRead => "this project, RwLock read",
            Kind::ManualWrite => "this project, RwLock write",
            Kind::Attribute => "this project, #[distributed_lock]",
            Kind::AttributeWait => "this project, #[distributed_lock], wait",
            Kind::HandWritten => "hand-written redis crate (floor)",
            Kind::Rslock => "rslock, defaults",
            Kind::RslockFast => "rslock, 1 ms retry delay",
        }
    }
}

pub(crate) const TTL: Duration = Duration::from_secs(10);
/// How long a waiting locker of this project waits at most (never reached).
const WAIT: Duration = Duration::from_secs(120);

/// Which lock of this project a [`Locker::Ours`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The exclusive `Lock`.
    Exclusive,
    /// `RwLock::read()`.
    Read,
    /// `RwLock::write()`.
    Write,
}

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// One contender's connection to Redis, per implementation.
pub(crate) enum Locker {
    Ours {
        client: Client,
        key: String,
        side: Side,
        fair: bool,
        wait: bool,
    },
    Attribute,
    AttributeWait,
    HandWritten {
        connection: MultiplexedConnection,
        script: redis::Script,
        key: String,
        counter: u64,
    },
    Rslock(rslock::LockManager, String),
}

/// A held lock, per implementation.
pub(crate) enum Held {
    Ours(LockGuard),
    HandWritten(String),
    Rslock(rslock::LockGuard),
}

impl Locker {
    /// A contender for `key`. `wait` asks the waiting variant (W3).
    pub(crate) async fn new(kind: Kind, url: &str, key: &str, wait: bool) -> Locker {
        match kind {
            Kind::Manual
            | Kind::ManualFair
            | Kind::ManualWait
            | Kind::ManualWaitShared
            | Kind::ManualRead
            | Kind::ManualWrite => Locker::Ours {
                client: Client::new(Config::new(url)).expect("client"),
                key: key.to_owned(),
                side: match kind {
                    Kind::ManualRead => Side::Read,
                    Kind::ManualWrite => Side::Write,
                    _ => Side::Exclusive,
                },
                fair: kind == Kind::ManualFair,
                wait: wait || matches!(kind, Kind::ManualWait | Kind::ManualWaitShared),
            },
            Kind::Attribute => Locker::Attribute,
            Kind::AttributeWait => Locker::AttributeWait,
            Kind::HandWritten => Locker::HandWritten {
                connection: redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
                script: redis::Script::new(RELEASE),
                key: key.to_owned(),
                counter: 0,
            },
            Kind::Rslock | Kind::RslockFast => {
                let mut manager = rslock::LockManager::new(node_urls(url));
                if kind == Kind::RslockFast {
                    manager.set_retry(3, Duration::from_millis(1));
                }
                Locker::Rslock(manager, key.to_owned())
            }
        }
    }

    /// The same locker (sharing its client or connection) for another key.
    pub(crate) fn for_key(&self, key: &str) -> Locker {
        match self {
            Locker::Ours {
                client,
                side,
                fair,
                wait,
                ..
            } => Locker::Ours {
                client: client.clone(),
                key: key.to_owned(),
                side: *side,
                fair: *fair,
                wait: *wait,
            },
            Locker::Attribute => Locker::Attribute,
            Locker::AttributeWait => Locker::AttributeWait,
            Locker::HandWritten {
                connection, script, ..
            } => Locker::HandWritten {
                connection: connection.clone(),
                script: script.clone(),
                key: key.to_owned(),
                counter: 0,
            },
            Locker::Rslock(manager, _) => Locker::Rslock(manager.clone(), key.to_owned()),
        }
    }

    /// Takes the lock (waiting if the locker waits) and returns it.
    pub(crate) async fn lock(&mut self) -> Held {
        self.try_lock(WAIT)
            .await
            .unwrap_or_else(|error| panic!("acquire: {error}"))
    }

    /// [`lock`](Self::lock), failing instead of panicking; this project's
    /// waiting locker waits at most `wait` (rslock's `acquire` retries until
    /// it gets the lock, the hand-written one polls without end).
    pub(crate) async fn try_lock(&mut self, wait: Duration) -> Result<Held, String> {
        match self {
            Locker::Ours {
                client,
                key,
                side,
                fair,
                wait: waits,
            } => {
                let lock = match side {
                    Side::Exclusive => Lock::new(key.as_str()),
                    Side::Read => RwLock::new(key.as_str()).read(),
                    Side::Write => RwLock::new(key.as_str()).write(),
                };
                let mut lock = lock.ttl(TTL).client(client.clone());
                if *waits {
                    lock = lock.wait(wait);
                }
                if *fair {
                    lock = lock.fair();
                }
                lock.acquire()
                    .await
                    .map(Held::Ours)
                    .map_err(|error| error.to_string())
            }
            Locker::Attribute | Locker::AttributeWait => {
                unreachable!("the attribute runs its body itself")
            }
            Locker::HandWritten {
                connection,
                key,
                counter,
                ..
            } => {
                *counter += 1;
                let token = format!("{:016x}{counter:016x}", std::process::id());
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&*key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(connection)
                        .await
                        .expect("SET");
                    if set.is_some() {
                        return Ok(Held::HandWritten(token));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            Locker::Rslock(manager, key) => manager
                .acquire(key.as_bytes(), TTL)
                .await
                .map(Held::Rslock)
                .map_err(|error| format!("rslock: {error}")),
        }
    }

    pub(crate) async fn unlock(&mut self, held: Held) {
        self.try_unlock(held).await.expect("release");
    }

    /// [`unlock`](Self::unlock), failing instead of panicking (rslock's
    /// release reports nothing).
    pub(crate) async fn try_unlock(&mut self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Locker::Ours { .. }, Held::Ours(guard)) => {
                guard.release().await.map_err(|error| error.to_string())
            }
            (
                Locker::HandWritten {
                    connection,
                    script,
                    key,
                    ..
                },
                Held::HandWritten(token),
            ) => {
                let released: Result<i64, _> =
                    script.key(&*key).arg(token).invoke_async(connection).await;
                released.map(drop).map_err(|error| error.to_string())
            }
            (Locker::Rslock(..), Held::Rslock(guard)) => {
                guard.release().await;
                Ok(())
            }
            _ => unreachable!("held by another implementation"),
        }
    }
}

/// The attribute's lock + unlock with an empty body (W1, W2).
#[distributed_lock(key = "<key>", ttl = "10s")]
pub(crate) async fn attribute_pair(key: &str) -> Result<(), LockError> {
    Ok(())
}

/// The same, as a handler takes it: waiting up to 2 s (W1, W2).
#[distributed_lock(key = "<key>", ttl = "10s", wait = "2s")]
pub(crate) async fn attribute_wait_pair(key: &str) -> Result<(), LockError> {
    Ok(())
}

/// The attribute's contended section (W3): `body` runs under the lock.
#[distributed_lock(key = "<key>", ttl = "10s", wait = "120s")]
pub(crate) async fn attribute_section<F: std::future::Future<Output = ()>>(
    key: &str,
    body: F,
) -> Result<(), LockError> {
    body.await;
    Ok(())
}

/// The node URLs of `url`: each node of a `redis-quorum://h1:p1,h2:p2`
/// URL (rslock takes them as a list), or `url` itself.
fn node_urls(url: &str) -> Vec<String> {
    match url.strip_prefix("redis-quorum://") {
        Some(hosts) => hosts
            .split(',')
            .map(|host| format!("redis://{host}/"))
            .collect(),
        None => vec![url.to_owned()],
    }
}
