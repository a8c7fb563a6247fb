//! `#[distributed_lock(read)]`, `(write)` and `(permits = N)` against a real
//! Redis: readers overlap, writers exclude each other and readers, a
//! semaphore lets at most N bodies in at once, the other arguments go along,
//! and reentry on one key downgrades (a read inside a write) but never
//! upgrades (a write inside a read).
//!
//! `init` configures the process once, so the cases run in one test, one
//! after another, each on its own keys and bounded by `CASE_TIMEOUT`.

mod common;
use common::*;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{current, distributed_lock, Client, Config, ConfigError, LockError};
use tokio::sync::{oneshot, watch, Barrier};

/// Generous bound for one case: only hit when something hangs.
const CASE_TIMEOUT: Duration = Duration::from_secs(20);

/// Counts the bodies running at once, and the most seen at once.
struct Gauge {
    inside: AtomicUsize,
    most: watch::Sender<usize>,
}

impl Gauge {
    fn new() -> Arc<Gauge> {
        Arc::new(Gauge {
            inside: AtomicUsize::new(0),
            most: watch::Sender::new(0),
        })
    }

    /// Counts one more body inside until the returned value is dropped.
    fn enter(&self) -> Inside<'_> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.send_if_modified(|most| {
            let higher = now > *most;
            *most = (*most).max(now);
            higher
        });
        Inside(self)
    }

    /// Waits (bounded) until `count` bodies were inside at once.
    async fn reached(&self, count: usize) {
        let mut most = self.most.subscribe();
        bounded(
            "enough bodies are inside at once",
            most.wait_for(|most| *most >= count),
        )
        .await
        .unwrap();
    }

    fn most(&self) -> usize {
        *self.most.borrow()
    }
}

struct Inside<'a>(&'a Gauge);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn bounded<F: Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(CASE_TIMEOUT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
}

/// How long a body stays inside after it has checked in, for a body that
/// should not be there to show up in the gauge: an observation window, not
/// a synchronization.
const WINDOW: Duration = Duration::from_millis(20);

// Read and write sides of `kinds:doc`.

/// Every reader waits inside until all `readers.n()` are inside: only
/// overlapping readers get through.
#[distributed_lock(key = "kinds:doc", read, wait = "5s")]
async fn read_doc(readers: &Barrier, gauge: &Gauge) -> Result<String, LockError> {
    let _inside = gauge.enter();
    bounded("every reader is inside", readers.wait()).await;
    Ok(current().expect("inside the body").redis_key().to_owned())
}

#[distributed_lock(key = "kinds:doc", write, wait = "5s")]
async fn write_doc(gauge: &Gauge) -> Result<(), LockError> {
    let _inside = gauge.enter();
    tokio::time::sleep(WINDOW).await;
    Ok(())
}

/// Holds the write side until told to go.
#[distributed_lock(key = "kinds:doc", write, wait = "5s")]
async fn hold_doc(
    entered: oneshot::Sender<()>,
    go: oneshot::Receiver<()>,
) -> Result<(), LockError> {
    entered.send(()).unwrap();
    bounded("the test lets the writer go", go).await.unwrap();
    Ok(())
}

/// The read side, not waiting: `None` when busy.
#[distributed_lock(key = "kinds:doc", read)]
async fn peek_doc() -> Option<()> {
    Some(())
}

/// The write side, not waiting.
#[distributed_lock(key = "kinds:doc", write)]
async fn poke_doc() -> Option<()> {
    Some(())
}

async fn readers_overlap() {
    const READERS: usize = 4;
    let readers = Arc::new(Barrier::new(READERS));
    let gauge = Gauge::new();
    let calls: Vec<_> = (0..READERS)
        .map(|_| {
            let (readers, gauge) = (Arc::clone(&readers), Arc::clone(&gauge));
            tokio::spawn(async move { read_doc(&readers, &gauge).await })
        })
        .collect();
    for call in calls {
        let key = call.await.unwrap().unwrap();
        assert_eq!(key, "lock:{kinds:doc}:rw");
    }
    assert_eq!(gauge.most(), READERS, "the readers did not all overlap");
}

async fn writers_exclude(server: &RedisServer) {
    const WRITERS: usize = 4;
    let start = Arc::new(Barrier::new(WRITERS));
    let gauge = Gauge::new();
    let calls: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (start, gauge) = (Arc::clone(&start), Arc::clone(&gauge));
            tokio::spawn(async move {
                start.wait().await;
                write_doc(&gauge).await
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(gauge.most(), 1, "two writers were inside at once");

    // A held write side keeps readers and other writers out.
    let (entered, entered_rx) = oneshot::channel();
    let (go, go_rx) = oneshot::channel();
    let holder = tokio::spawn(hold_doc(entered, go_rx));
    entered_rx.await.unwrap();
    assert_eq!(
        redis(server, &["EXISTS", "lock:{kinds:doc}:rw"]),
        ":1\r\n",
        "the write side is held at the read/write lock's key"
    );
    assert_eq!(peek_doc().await, None, "a reader entered beside a writer");
    assert_eq!(poke_doc().await, None, "a second writer entered");
    go.send(()).unwrap();
    holder.await.unwrap().unwrap();
    assert_eq!(peek_doc().await, Some(()));
    assert_eq!(poke_doc().await, Some(()));
}

// A semaphore of 2 permits, on a client of its own.

struct App {
    locks: Client,
    /// The port of the Redis `locks` talks to.
    port: u16,
    /// The port of the process-wide client's Redis.
    global_port: u16,
}

#[distributed_lock(key = "kinds:exports", permits = 2, wait = "5s", client = app.locks)]
async fn export(app: &App, gauge: &Gauge) -> Result<(), LockError> {
    let _inside = gauge.enter();
    // The first two in wait for each other: the semaphore lets both in.
    gauge.reached(2).await;
    tokio::time::sleep(WINDOW).await;
    let key = current().expect("inside the body").redis_key().to_owned();
    assert_eq!(key, "lock:{kinds:exports}:sem");
    let exists = |port| test_support::command(port, &["EXISTS", &key]).unwrap();
    assert_eq!(exists(app.port), ":1\r\n", "not on the `client` given");
    assert_eq!(
        exists(app.global_port),
        ":0\r\n",
        "on the process-wide client"
    );
    Ok(())
}

async fn permits_bound_the_bodies(server: &RedisServer, other: &RedisServer) {
    const CALLERS: usize = 6;
    let app = Arc::new(App {
        locks: Client::new(Config::new(other.url())).unwrap(),
        port: other.port(),
        global_port: server.port(),
    });
    let start = Arc::new(Barrier::new(CALLERS));
    let gauge = Gauge::new();
    let calls: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (app, start, gauge) = (Arc::clone(&app), Arc::clone(&start), Arc::clone(&gauge));
            tokio::spawn(async move {
                start.wait().await;
                export(&app, &gauge).await
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(gauge.most(), 2, "more bodies than permits were inside");
}

// `renew`, `wait`, `fair` and `fencing` on both sides of `kinds:ledger`.

#[derive(Debug)]
struct Held {
    fencing_token: Option<u64>,
    renewed: bool,
    held_past_ttl: bool,
}

/// Outlives its ttl: renewed, it still holds the lock after it.
#[distributed_lock(
    key = "kinds:ledger",
    write,
    ttl = "600ms",
    wait = "2s",
    renew,
    fair,
    fencing
)]
async fn post_entry() -> Result<Held, LockError> {
    let lock = current().expect("inside the body");
    // Until a ttl has passed and a renewal moved its validity past the one
    // it was acquired with (or it was lost).
    let started = Instant::now();
    while lock.is_held()
        && (started.elapsed() <= lock.ttl()
            || Instant::now() + lock.remaining() <= started + lock.ttl())
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Held {
        fencing_token: lock.fencing_token(),
        renewed: lock.is_renewed(),
        held_past_ttl: lock.is_held(),
    })
}

#[distributed_lock(
    key = "kinds:ledger",
    read,
    ttl = "5s",
    wait = "2s",
    renew,
    fair,
    fencing
)]
async fn read_ledger() -> Result<Held, LockError> {
    let lock = current().expect("inside the body");
    Ok(Held {
        fencing_token: lock.fencing_token(),
        renewed: lock.is_renewed(),
        held_past_ttl: false,
    })
}

async fn other_arguments_go_along() {
    let written = post_entry().await.unwrap();
    assert!(written.renewed, "{written:?}");
    assert!(written.held_past_ttl, "the write side was not renewed");
    let read = read_ledger().await.unwrap();
    assert!(read.renewed, "{read:?}");
    let (Some(first), Some(second)) = (written.fencing_token, read.fencing_token) else {
        panic!("no fencing tokens: {written:?}, {read:?}");
    };
    assert!(second > first, "{written:?}, {read:?}");
}

// Reentry on `kinds:nest:<id>`.

#[distributed_lock(key = "kinds:nest:<id>", write, wait = "5s")]
async fn write_then_read(id: u32) -> Result<(String, Result<String, LockError>), LockError> {
    let outer = current().expect("inside the body").token().to_owned();
    Ok((outer, read_inside(id).await))
}

/// No `wait`: it enters at once or fails.
#[distributed_lock(key = "kinds:nest:<id>", read)]
async fn read_inside(id: u32) -> Result<String, LockError> {
    let _ = id;
    Ok(current().expect("inside the body").token().to_owned())
}

#[distributed_lock(key = "kinds:nest:<id>", read, wait = "5s")]
async fn read_then_write(id: u32) -> Result<Result<(), LockError>, LockError> {
    Ok(write_inside(id).await)
}

static WRITES_INSIDE: AtomicUsize = AtomicUsize::new(0);

/// Would wait 5 s for a busy lock: it must fail at once instead.
#[distributed_lock(key = "kinds:nest:<id>", write, wait = "5s")]
async fn write_inside(id: u32) -> Result<(), LockError> {
    let _ = id;
    WRITES_INSIDE.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn reentry_downgrades_but_never_upgrades() {
    let started = Instant::now();
    let (outer, inner) = write_then_read(1).await.unwrap();
    assert_eq!(
        inner.unwrap(),
        outer,
        "the read inside the write shares the write's hold"
    );

    let inner = read_then_write(2).await.unwrap();
    match inner {
        Err(LockError::Config(ConfigError::Reentry { reason, .. })) => {
            assert!(reason.contains("held for reading"), "{reason}")
        }
        other => panic!("a write inside a read gave {other:?}"),
    }
    assert_eq!(
        WRITES_INSIDE.load(Ordering::SeqCst),
        0,
        "the write body ran"
    );
    // Neither waited (the write's `wait` is 5 s).
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");

    // Both keys were released.
    assert_eq!(write_inside(1).await.unwrap(), ());
    assert_eq!(write_inside(2).await.unwrap(), ());
}

#[test]
fn read_write_and_permits_attributes_run_under_their_kind() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    lock_runtime::init(server.url()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        bounded("readers overlap", readers_overlap()).await;
        bounded("writers exclude", writers_exclude(&server)).await;
        bounded(
            "permits bound the bodies",
            permits_bound_the_bodies(&server, &other),
        )
        .await;
        bounded("other arguments go along", other_arguments_go_along()).await;
        bounded(
            "reentry downgrades but never upgrades",
            reentry_downgrades_but_never_upgrades(),
        )
        .await;
    });
}
