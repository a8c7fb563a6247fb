//! `#[distributed_lock]` on the methods of an `#[async_trait]` impl, the shape
//! of a tonic service: a trait of async methods taking `&self` and a
//! `Request<T>`, returning `Result<Response<T>, Status>`, served by calls
//! from several tasks at once through two instances of the service (two
//! clients, as two replicas of a service would have), on a real Redis.
//!
//! async-trait expands first (it is on the impl) and hands the attribute
//! `fn .. -> Pin<Box<dyn Future + Send>>`; the attribute holds the lock
//! around that future. Without it, the attribute refused these methods
//! ("needs an `async fn`"), and this file did not compile.

mod common;
use common::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_runtime::{current, distributed_lock, Client, Config, LockError};
use tokio::sync::{mpsc, Semaphore};

/// tonic's request, response and status, as far as a service sees them.
mod grpc {
    pub struct Request<T>(pub T);
    impl<T> Request<T> {
        pub fn into_inner(self) -> T {
            self.0
        }
    }
    #[derive(Debug)]
    pub struct Response<T>(pub T);
    #[derive(Debug)]
    pub struct Status(pub String);
    impl From<lock_runtime::LockError> for Status {
        fn from(error: lock_runtime::LockError) -> Self {
            // tonic's `Status::unavailable(error.to_string())`.
            Status(error.to_string())
        }
    }
}
use grpc::{Request, Response, Status};

pub struct Deposit {
    pub account: u64,
    pub cents: i64,
}

/// The service's trait, as tonic generates it.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    async fn deposit(&self, request: Request<Deposit>) -> Result<Response<i64>, Status>;
    async fn try_deposit(&self, request: Request<Deposit>) -> Result<Response<i64>, Status>;
    async fn hold(&self, account: u64) -> Result<Response<String>, Status>;
    async fn move_between(&self, pair: (u64, u64)) -> Option<String>;
    async fn traced(&self, account: u64) -> Result<String, LockError>;
    async fn traced_inside(&self, account: u64) -> Result<String, LockError>;
}

struct LedgerService {
    locks: Client,
    redis: RedisPort,
    /// Bodies running at once, per service instance's view (all instances
    /// share it): never more than one per account.
    inside: Arc<AtomicUsize>,
    /// `hold` sends its key on entering and waits here before returning.
    entered: mpsc::UnboundedSender<String>,
    gate: Arc<Semaphore>,
}

/// The server's port: the bodies read and write the balance with their own
/// commands (a read, then a write: lost updates unless the lock holds).
#[derive(Clone, Copy)]
struct RedisPort(u16);

impl RedisPort {
    fn get(self, key: &str) -> i64 {
        let reply = test_support::command(self.0, &["GET", key]).unwrap();
        value(&reply).map_or(0, |value| value.parse().unwrap())
    }

    fn set(self, key: &str, value: i64) {
        test_support::command(self.0, &["SET", key, &value.to_string()]).unwrap();
    }
}

/// The key of the lock the body runs under.
fn held_key() -> String {
    current().expect("inside the body").name().to_owned()
}

#[async_trait]
impl Ledger for LedgerService {
    #[distributed_lock(key = "account:<request.0.account>", wait = "30s", client = self.locks)]
    async fn deposit(&self, request: Request<Deposit>) -> Result<Response<i64>, Status> {
        self.apply(request.into_inner()).await
    }

    #[distributed_lock(key = "account:<request.0.account>", client = self.locks)]
    async fn try_deposit(&self, request: Request<Deposit>) -> Result<Response<i64>, Status> {
        self.apply(request.into_inner()).await
    }

    #[distributed_lock(key = "account:<account>", client = self.locks)]
    async fn hold(&self, account: u64) -> Result<Response<String>, Status> {
        let _ = account;
        self.entered.send(held_key()).unwrap();
        drop(self.gate.acquire().await.unwrap());
        Ok(Response(held_key()))
    }

    /// A destructured parameter (async-trait renames it `__arg1`).
    #[distributed_lock(key = "move:<from>-<to>", client = self.locks)]
    async fn move_between(&self, (from, to): (u64, u64)) -> Option<String> {
        let _ = (from, to);
        Some(held_key())
    }

    /// Stacked with `#[tracing::instrument]`, the lock outside the span.
    #[distributed_lock(key = "traced:<account>", client = self.locks)]
    #[tracing::instrument(skip(self))]
    async fn traced(&self, account: u64) -> Result<String, LockError> {
        let _ = account;
        Ok(held_key())
    }

    /// The other order: `instrument` rewrites async-trait's future first,
    /// then the lock is held around what it made.
    #[tracing::instrument(skip(self))]
    #[distributed_lock(key = "traced:<account>", client = self.locks)]
    async fn traced_inside(&self, account: u64) -> Result<String, LockError> {
        let _ = account;
        Ok(held_key())
    }
}

impl LedgerService {
    /// A read-modify-write of the balance with awaits between: two bodies
    /// at once lose one of the deposits.
    async fn apply(&self, deposit: Deposit) -> Result<Response<i64>, Status> {
        let running = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        assert_eq!(running, 1, "two deposits ran at once");
        let key = format!("balance:{}", deposit.account);
        let redis = self.redis;
        let before = tokio::task::spawn_blocking({
            let key = key.clone();
            move || redis.get(&key)
        })
        .await
        .unwrap();
        tokio::task::yield_now().await;
        let after = before + deposit.cents;
        tokio::task::spawn_blocking(move || redis.set(&key, after))
            .await
            .unwrap();
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok(Response(after))
    }
}

fn service(server: &RedisServer, inside: &Arc<AtomicUsize>) -> Arc<dyn Ledger> {
    let (entered, _) = mpsc::unbounded_channel();
    Arc::new(LedgerService {
        locks: Client::new(Config::new(server.url())).unwrap(),
        redis: RedisPort(server.port()),
        inside: inside.clone(),
        entered,
        gate: Arc::new(Semaphore::new(0)),
    })
}

/// 4 tasks on each of two service instances (two clients) deposit into one
/// account at once: every deposit lands, no two bodies ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_to_a_tonic_style_service_are_serialized() {
    let server = RedisServer::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let replicas = [service(&server, &inside), service(&server, &inside)];
    const TASKS: usize = 4;
    const CALLS: usize = 10;
    let mut tasks = Vec::new();
    for task in 0..TASKS * replicas.len() {
        let service = replicas[task % replicas.len()].clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..CALLS {
                let deposit = Deposit {
                    account: 7,
                    cents: 1,
                };
                service.deposit(Request(deposit)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total = (TASKS * replicas.len() * CALLS) as i64;
    assert_eq!(RedisPort(server.port()).get("balance:7"), total);
    assert_eq!(redis(&server, &["EXISTS", "lock:{account:7}"]), ":0\r\n");
}

/// A call that does not wait finds the account busy while another call
/// holds it: its `Status` carries the lock's refusal, and its body did not
/// run. Another account and a destructured parameter's key go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_account_is_a_status_and_other_keys_go_through() {
    let server = RedisServer::start();
    let (entered, mut entered_rx) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let service: Arc<dyn Ledger> = Arc::new(LedgerService {
        locks: Client::new(Config::new(server.url())).unwrap(),
        redis: RedisPort(server.port()),
        inside: Arc::default(),
        entered,
        gate: gate.clone(),
    });
    let holder = tokio::spawn({
        let service = service.clone();
        async move { service.hold(3).await }
    });
    let key = tokio::time::timeout(LINE_TIMEOUT, entered_rx.recv())
        .await
        .expect("the holder entered in time")
        .unwrap();
    assert_eq!(key, "account:3");
    assert_eq!(redis(&server, &["EXISTS", "lock:{account:3}"]), ":1\r\n");

    let refused = service
        .try_deposit(Request(Deposit {
            account: 3,
            cents: 5,
        }))
        .await
        .expect_err("the account is held");
    assert!(refused.0.contains("account:3"), "{refused:?}");
    assert_eq!(RedisPort(server.port()).get("balance:3"), 0);

    let other = service
        .try_deposit(Request(Deposit {
            account: 4,
            cents: 5,
        }))
        .await
        .unwrap();
    assert_eq!(other.0, 5);
    assert_eq!(
        service.move_between((3, 4)).await.as_deref(),
        Some("move:3-4")
    );
    assert_eq!(service.traced(3).await.unwrap(), "traced:3");
    assert_eq!(service.traced_inside(3).await.unwrap(), "traced:3");

    gate.add_permits(1);
    let held = tokio::time::timeout(Duration::from_secs(30), holder)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(held.0, "account:3");
    wait_until_async("the lock is released", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{account:3}"]) == ":0\r\n"
    })
    .await;
}
