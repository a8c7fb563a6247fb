//! `#[distributed_lock]` in one process: return-type rules, methods, key
//! rendering, `?` and `return` in bodies, and `wait`.
//!
//! `init` configures the process once, so the cases run in one test, one
//! after another; the last ones check that a second runtime gets its own
//! working connection from the process-wide client.

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{current, distributed_lock, Lock, LockError};

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
enum JobError {
    Lock(LockError),
    Invalid,
}

impl From<LockError> for JobError {
    fn from(error: LockError) -> Self {
        JobError::Lock(error)
    }
}

#[distributed_lock(key = "lottery:<date>", ttl = "10s")]
async fn draw(date: &str, fail: bool) -> Result<Vec<u32>, JobError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if fail {
        return Err(JobError::Invalid);
    }
    let winners = parse_winners("7,42")?;
    Ok(winners)
}

fn parse_winners(text: &str) -> Result<Vec<u32>, JobError> {
    text.split(',')
        .map(|n| n.parse().map_err(|_| JobError::Invalid))
        .collect()
}

#[distributed_lock(key = "report:<day>")]
async fn report(day: u32) -> Option<u32> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Some(day)
}

#[distributed_lock(key = "cleanup")]
async fn cleanup() {
    RUNS.fetch_add(1, Ordering::SeqCst);
}

#[distributed_lock(key = "file:<name>", ttl = "1s")]
async fn write_file(name: &str) -> std::io::Result<usize> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(name.len())
}

struct Order {
    id: u64,
    r#type: &'static str,
}

#[distributed_lock(key = "kind:<order.r#type>:<pair.0>")]
async fn keyed_by_odd_fields(order: &Order, pair: (u8, u8)) -> Option<String> {
    #![allow(unused_variables)]
    let unused = pair.1;
    current().map(|lock| lock.name().to_owned())
}

#[distributed_lock(key = "endless")]
async fn endless() -> Result<(), LockError> {
    std::future::pending::<()>().await;
    Ok(())
}

#[distributed_lock(key = "exploding")]
async fn exploding() {
    panic!("the body fails");
}

struct Shard {
    shard: u8,
    handled: usize,
}

impl Shard {
    #[distributed_lock(key = "order:<self.shard>:<order.id>", ttl = "5s")]
    async fn settle(&self, order: &Order, server_port: u16) -> Result<String, LockError> {
        // The key is rendered from the receiver's field and the parameter's.
        let key = format!("lock:{{order:{}:{}}}", self.shard, order.id);
        Ok(test_support::command(server_port, &["EXISTS", &key]).unwrap())
    }

    #[distributed_lock(key = "shard:<self.shard>", wait = "5s")]
    async fn handle(&mut self) -> Result<usize, LockError> {
        self.handled += 1;
        Ok(self.handled)
    }
}

async fn hold(name: &str) -> lock_runtime::LockGuard {
    Lock::new(name)
        .ttl(Duration::from_secs(30))
        .try_acquire()
        .await
        .unwrap()
}

#[test]
fn the_attribute_follows_the_return_type_rules() {
    let server = RedisServer::start();
    lock_runtime::init(server.url()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // Free: the body runs, `?` and `return` work, the lock is gone after.
        assert_eq!(draw("d1", false).await.unwrap(), vec![7, 42]);
        assert!(matches!(draw("d1", true).await, Err(JobError::Invalid)));
        assert_eq!(redis(&server, &["EXISTS", "lock:{lottery:d1}"]), ":0\r\n");
        assert_eq!(RUNS.swap(0, Ordering::SeqCst), 2);

        // Busy: nothing runs; each return type says so its own way.
        let _a = hold("lottery:d2").await;
        let _b = hold("report:5").await;
        let _c = hold("cleanup").await;
        let _d = hold("file:a.txt").await;
        match draw("d2", false).await {
            Err(JobError::Lock(LockError::Busy { name })) => assert_eq!(name, "lottery:d2"),
            other => panic!("{other:?}"),
        }
        assert_eq!(report(5).await, None);
        cleanup().await;
        let io = write_file("a.txt").await.unwrap_err();
        assert_eq!(io.kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!(
            RUNS.load(Ordering::SeqCst),
            0,
            "a body ran without the lock"
        );

        // Other keys are independent.
        assert_eq!(report(6).await, Some(6));
        assert_eq!(write_file("b.txt").await.unwrap(), 5);

        // Methods: field paths in the key, `&self` and `&mut self`.
        let mut shard = Shard {
            shard: 3,
            handled: 0,
        };
        let during = shard
            .settle(
                &Order {
                    id: 77,
                    r#type: "gift",
                },
                server.port(),
            )
            .await
            .unwrap();
        assert_eq!(during, ":1\r\n", "the rendered key is held during the body");
        assert_eq!(redis(&server, &["EXISTS", "lock:{order:3:77}"]), ":0\r\n");

        // Raw identifiers, tuple fields and inner attributes in the body.
        let order = Order {
            id: 1,
            r#type: "gift",
        };
        assert_eq!(
            keyed_by_odd_fields(&order, (4, 2)).await.as_deref(),
            Some("kind:gift:4")
        );

        // `wait`: a waiting method is still waiting while the lock is held,
        // and gets it once its holder releases.
        let holder = hold("shard:3").await;
        let waiting = tokio::spawn(async move { (shard.handle().await, shard) });
        // It waits (in Redis, or in the process: the holder is of its
        // client too).
        let client = lock_runtime::global_client().unwrap();
        wait_until_async("the waiter waits", LINE_TIMEOUT, || {
            redis(&server, &["LLEN", "lock:{shard:3}:queue"]) == ":1\r\n"
                || client.waiting_in_process("shard:3") == 1
        })
        .await;
        assert!(!waiting.is_finished(), "the waiter did not wait");
        holder.release().await.unwrap();
        let (handled, _shard) = waiting.await.unwrap();
        assert_eq!(handled.unwrap(), 1);

        // A dropped (aborted) call and a panicking body release the lock.
        let call = tokio::spawn(endless());
        wait_until_async("the endless body holds the lock", LINE_TIMEOUT, || {
            redis(&server, &["EXISTS", "lock:{endless}"]) == ":1\r\n"
        })
        .await;
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        wait_until_async("the aborted call's lock is released", LINE_TIMEOUT, || {
            redis(&server, &["EXISTS", "lock:{endless}"]) == ":0\r\n"
        })
        .await;
        assert!(tokio::spawn(exploding()).await.unwrap_err().is_panic());
        wait_until_async("the panicked call's lock is released", LINE_TIMEOUT, || {
            redis(&server, &["EXISTS", "lock:{exploding}"]) == ":0\r\n"
        })
        .await;
    });
    drop(runtime);

    // A new runtime (as each `#[tokio::test]` has) gets a working connection.
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        assert_eq!(report(41).await, Some(41));
        assert_eq!(report(42).await, Some(42));
    });
}
