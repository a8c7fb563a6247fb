//! `#[distributed_lock]` on the signatures real services have: placeholders
//! from destructured parameters (axum-style extractors, tuples, struct
//! patterns), `client = <expr>` naming the lock client, and `crate = "path"`
//! through a re-export.
//!
//! No test calls `lock_runtime::init`: every lock names its client, so a lock
//! that fell back to the process-wide client would fail for want of a URL.

mod common;
use common::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lock_runtime::{current, distributed_lock, Client, Config, Lock, LockError};
use tokio::sync::{mpsc, Semaphore};

/// Stand-ins for axum's extractors: tuple structs a handler destructures.
mod extract {
    pub struct State<T>(pub T);
    pub struct Path<T>(pub T);
    pub struct Json<T>(pub T);
}
use extract::{Json, Path, State};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// The key of the lock the body runs under.
fn held_key() -> String {
    current().expect("inside the body").name().to_owned()
}

#[derive(Clone)]
struct App {
    locks: Client,
    /// Each body sends its key on entering.
    entered: mpsc::UnboundedSender<String>,
    /// Each body waits here for a permit before returning.
    gate: Arc<Semaphore>,
    /// Bodies running, per order id.
    inside: Arc<Mutex<HashMap<u64, usize>>>,
}

#[distributed_lock(key = "order:<id>", wait = "10s", client = app.locks)]
async fn settle(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
    let key = held_key();
    {
        let mut inside = app.inside.lock().unwrap();
        let running = inside.entry(id).or_default();
        *running += 1;
        assert_eq!(*running, 1, "two calls for order {id} ran at once");
    }
    // `client = app.locks` borrowed `app`: the body still has all of it.
    app.entered.send(key.clone()).unwrap();
    drop(app.gate.acquire().await.unwrap());
    *app.inside.lock().unwrap().get_mut(&id).unwrap() -= 1;
    Ok(key)
}

/// The same lock, not waited for.
#[distributed_lock(key = "order:<id>", client = app.locks)]
async fn peek(State(app): State<App>, Path(id): Path<u64>) -> Result<String, LockError> {
    let _ = (&app, id);
    Ok(held_key())
}

struct Refund {
    order_id: u64,
    cents: u32,
}

#[distributed_lock(key = "refund:<req.order_id>", client = &app.locks)]
async fn refund(State(app): State<App>, Json(req): Json<Refund>) -> Option<(String, u32)> {
    let _ = &app;
    Some((held_key(), req.cents))
}

async fn entered(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(LINE_TIMEOUT, rx.recv())
        .await
        .expect("a body entered in time")
        .expect("the channel is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_style_handler_locks_per_extracted_id() {
    let server = RedisServer::start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let app = App {
        locks: client(&server),
        entered: tx,
        gate: Arc::new(Semaphore::new(0)),
        inside: Arc::default(),
    };

    // The first call for order 1 holds the lock, under the rendered key.
    let first = tokio::spawn(settle(State(app.clone()), Path(1)));
    assert_eq!(entered(&mut rx).await, "order:1");
    assert_eq!(redis(&server, &["EXISTS", "lock:{order:1}"]), ":1\r\n");

    // The same id is excluded: not waited for, it is busy...
    match peek(State(app.clone()), Path(1)).await {
        Err(LockError::Busy { name }) => assert_eq!(name, "order:1"),
        other => panic!("{other:?}"),
    }
    // ...and waited for, it waits; another id goes in meanwhile.
    let second = tokio::spawn(settle(State(app.clone()), Path(1)));
    let other = tokio::spawn(settle(State(app.clone()), Path(2)));
    assert_eq!(entered(&mut rx).await, "order:2");
    assert_eq!(peek(State(app.clone()), Path(3)).await.unwrap(), "order:3");
    // The second call for order 1 waits (in Redis, or in the process).
    wait_until_async("the second call for order 1 waits", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{order:1}:queue"]) == ":1\r\n"
            || app.locks.waiting_in_process("order:1") == 1
    })
    .await;
    assert!(
        rx.try_recv().is_err(),
        "the second call for order 1 went in"
    );
    assert!(!second.is_finished());

    // Once the first call returns, the second gets the lock.
    app.gate.add_permits(3);
    assert_eq!(first.await.unwrap().unwrap(), "order:1");
    assert_eq!(other.await.unwrap().unwrap(), "order:2");
    assert_eq!(entered(&mut rx).await, "order:1");
    assert_eq!(second.await.unwrap().unwrap(), "order:1");
    for key in ["lock:{order:1}", "lock:{order:2}", "lock:{order:3}"] {
        assert_eq!(redis(&server, &["EXISTS", key]), ":0\r\n", "{key}");
    }

    // A field path under a destructured name.
    let request = Refund {
        order_id: 77,
        cents: 250,
    };
    assert_eq!(
        refund(State(app.clone()), Json(request)).await,
        Some(("refund:77".to_owned(), 250))
    );
}

struct Shop {
    region: &'static str,
    open: bool,
}

struct Order {
    id: u64,
    shop: Shop,
    note: &'static str,
}

fn order(id: u64) -> Order {
    Order {
        id,
        shop: Shop {
            region: "eu",
            open: true,
        },
        note: "gift",
    }
}

/// A struct pattern with shorthand fields; the client is a `&Client`.
#[distributed_lock(key = "ship:<id>:<note>", client = locks)]
async fn ship(Order { id, note, .. }: Order, locks: &Client) -> Option<String> {
    let _ = (id, note);
    Some(held_key())
}

/// Renamed and nested fields, a tuple; the client is an `Arc<Client>`.
#[distributed_lock(key = "route:<region>:<order_id>:<from>-<to>", client = locks)]
async fn route(
    Order {
        id: order_id,
        shop: Shop { region, .. },
        ..
    }: Order,
    (from, to): (u32, u32),
    locks: Arc<Client>,
) -> Option<String> {
    let _ = (order_id, region, from, to, locks.clone());
    Some(held_key())
}

#[derive(Clone, Copy)]
struct Tag(&'static str, u8);

/// `x @ pattern`, `ref` and `mut` bindings, a reference pattern, a rest
/// pattern and `_`; the client is a method call's result.
#[distributed_lock(key = "tag:<whole.1>:<label>:<x>:<y>:<last>", client = locks.clone())]
async fn tag(
    whole @ Tag(ref label, _): Tag,
    &(x, mut y): &(u8, u8),
    [.., last]: [u8; 3],
    _: u8,
    locks: Client,
) -> Option<String> {
    y += 1;
    let _ = (whole.0, label, x, y, last, locks);
    Some(held_key())
}

#[tokio::test]
async fn struct_tuple_and_nested_patterns_name_the_key() {
    let server = RedisServer::start();
    let locks = client(&server);

    assert_eq!(ship(order(5), &locks).await.as_deref(), Some("ship:5:gift"));
    let shared = Arc::new(locks.clone());
    assert_eq!(
        route(order(6), (10, 20), shared).await.as_deref(),
        Some("route:eu:6:10-20")
    );
    assert_eq!(
        tag(Tag("red", 4), &(1, 2), [7, 8, 9], 0, locks.clone())
            .await
            .as_deref(),
        Some("tag:4:red:1:2:9")
    );
    assert!(order(0).shop.open);

    // The keys are the locks taken: a held key makes the call busy.
    let held = Lock::new("ship:5:gift")
        .client(locks.clone())
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(ship(order(5), &locks).await, None);
    held.release().await.unwrap();
    assert_eq!(ship(order(5), &locks).await.as_deref(), Some("ship:5:gift"));
}

struct Service {
    locks: Client,
    shard: u8,
    handled: usize,
}

impl Service {
    #[distributed_lock(key = "svc:<self.shard>:<id>", client = self.locks)]
    async fn handle(&self, Path(id): Path<u64>) -> Result<String, LockError> {
        let _ = id;
        Ok(held_key())
    }

    #[distributed_lock(key = "svc:<self.shard>", client = self.locks, wait = "5s")]
    async fn count(&mut self) -> Result<usize, LockError> {
        self.handled += 1;
        Ok(self.handled)
    }

    /// By value: the body owns `self` after the client was cloned from it.
    #[distributed_lock(key = "svc:<self.shard>:close", client = self.locks)]
    async fn close(self) -> Option<(String, Client)> {
        Some((held_key(), self.locks))
    }
}

#[tokio::test]
async fn a_method_names_its_client_with_self() {
    let server = RedisServer::start();
    let mut service = Service {
        locks: client(&server),
        shard: 3,
        handled: 0,
    };
    assert_eq!(service.handle(Path(9)).await.unwrap(), "svc:3:9");
    assert_eq!(service.count().await.unwrap(), 1);

    let held = Lock::new("svc:3:9")
        .client(service.locks.clone())
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{svc:3:9}"]), ":1\r\n");
    match service.handle(Path(9)).await {
        Err(LockError::Busy { name }) => assert_eq!(name, "svc:3:9"),
        other => panic!("{other:?}"),
    }
    held.release().await.unwrap();

    let (key, _locks) = service.close().await.unwrap();
    assert_eq!(key, "svc:3:close");
}

/// A crate that re-exports `lock_runtime` under its own path.
mod locks {
    pub use lock_runtime::*;
}

#[locks::distributed_lock(key = "report:<day>", crate = "crate::locks", client = client)]
async fn report(day: u32, client: &locks::Client) -> Option<String> {
    let _ = day;
    Some(held_key())
}

#[locks::distributed_lock(
    key = "digest:<day>",
    ttl = "1s",
    renew,
    on_lost = "continue",
    crate = "self::locks",
    client = client
)]
async fn digest(day: u32, client: Arc<locks::Client>) -> Result<String, locks::LockError> {
    let _ = (day, client);
    Ok(held_key())
}

#[tokio::test]
async fn crate_names_the_re_export() {
    let server = RedisServer::start();
    let locks = client(&server);
    assert_eq!(report(7, &locks).await.as_deref(), Some("report:7"));
    assert_eq!(
        digest(8, Arc::new(locks.clone())).await.unwrap(),
        "digest:8"
    );
}
