//! Reentrancy: a call chain in one task that enters the same key again.

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use lock_runtime::{current, distributed_lock, ConfigError, Lock, LockError};

#[distributed_lock(key = "account:<id>", ttl = "10s", fencing)]
async fn outer(id: u32, port: u16) -> Result<(Option<u64>, Option<u64>, bool), LockError> {
    let fence = current().unwrap().fencing_token();
    assert!(fence.is_some());
    // The same key from another task is excluded during the whole hold.
    let lock = Lock::new(format!("account:{id}"));
    let other_task = tokio::spawn(async move { lock.try_acquire().await.map(drop) })
        .await
        .unwrap();
    let excluded = matches!(other_task, Err(LockError::Busy { .. }));
    let inner_fence = inner(id).await?;
    // Released inner holds did not release or shorten the outer one.
    let key = format!("lock:{{account:{id}}}");
    assert_eq!(
        test_support::command(port, &["EXISTS", &key]).unwrap(),
        ":1\r\n"
    );
    let pttl: i64 = value(&test_support::command(port, &["PTTL", &key]).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pttl > 5_000,
        "the outer hold's expiry was shortened to {pttl} ms"
    );
    Ok((fence, inner_fence, excluded))
}

#[distributed_lock(key = "account:<id>", ttl = "1s", wait = "5s", fencing)]
async fn inner(id: u32) -> Result<Option<u64>, LockError> {
    // The manual API inside re-enters too; its release is a no-op.
    let guard = Lock::new(format!("account:{id}")).try_acquire().await?;
    assert!(guard.is_reentrant());
    guard.release().await?;
    Ok(current().unwrap().fencing_token())
}

#[distributed_lock(key = "tree:<name>", renew, ttl = "900ms")]
async fn walk(name: &str, depth: u32) -> Result<u32, LockError> {
    if depth == 0 {
        // Deep inside, the renewed outer hold is still held past its ttl:
        // waits until a ttl has passed and a renewal moved the validity past
        // the one it was acquired with (or the hold was lost).
        let lock = current().expect("inside the body");
        let started = std::time::Instant::now();
        while lock.is_held()
            && (started.elapsed() <= lock.ttl()
                || std::time::Instant::now() + lock.remaining() <= started + lock.ttl())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        return Ok(u32::from(lock.is_held()));
    }
    Ok(1 + Box::pin(walk(name, depth - 1)).await?)
}

/// Bodies inside `account:<id>` right now, and the most seen at once.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
static MOST_INSIDE: AtomicUsize = AtomicUsize::new(0);

#[distributed_lock(key = "account:<id>", ttl = "10s", wait = "5s")]
async fn settle(id: u32) -> Result<(), LockError> {
    let now = INSIDE.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_INSIDE.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    INSIDE.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "account:<id>", ttl = "10s")]
async fn settle_twice_at_once(id: u32) -> Result<(), LockError> {
    let (first, second) = tokio::join!(settle(id), settle(id));
    first.and(second)
}

#[test]
fn nested_and_recursive_calls_reenter() {
    let server = RedisServer::start();
    lock_runtime::init(server.url()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (fence, inner_fence, excluded) = outer(7, server.port()).await.unwrap();
        assert_eq!(fence, inner_fence, "an inner entry shares the outer hold");
        assert!(excluded, "another task got the lock during the outer hold");
        assert_eq!(redis(&server, &["EXISTS", "lock:{account:7}"]), ":0\r\n");

        assert_eq!(walk("root", 5).await.unwrap(), 6);
        assert_eq!(redis(&server, &["EXISTS", "lock:{tree:root}"]), ":0\r\n");

        // The case: two concurrent annotated calls inside the held
        // lock run one at a time, as they do without the outer hold.
        settle_twice_at_once(8).await.unwrap();
        assert_eq!(
            MOST_INSIDE.load(Ordering::SeqCst),
            1,
            "two bodies ran at once"
        );
        MOST_INSIDE.store(0, Ordering::SeqCst);
        let (first, second) = tokio::join!(settle(9), settle(9));
        first.and(second).unwrap();
        assert_eq!(MOST_INSIDE.load(Ordering::SeqCst), 1);
    });
}

/// Counts the bodies inside one lock at a time, across every entry path.
#[derive(Clone, Default)]
struct Inside(Arc<(AtomicUsize, AtomicUsize)>);

impl Inside {
    /// A body: inside for `millis`, yielding meanwhile.
    async fn body(&self, millis: u64) {
        let now = self.0 .0.fetch_add(1, Ordering::SeqCst) + 1;
        self.0 .1.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        self.0 .0.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.0 .1.load(Ordering::SeqCst)
    }
}

/// A multi-thread runtime (for `block_in_place` and moves between workers).
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn client(server: &RedisServer) -> lock_runtime::Client {
    lock_runtime::Client::new(lock_runtime::Config::new(server.url())).unwrap()
}

/// Every way a body can run code concurrently or hand it to another task,
/// inside a held lock: concurrent entries of one task exclude each other,
/// entries from another task are excluded like any other holder, and
/// sequential nesting goes straight in.
#[test]
fn reentry_matrix() {
    let server = RedisServer::start();
    let runtime = two_workers();
    runtime.block_on(async {
        let client = client(&server);
        let lock = Lock::new("matrix").client(client.clone());
        let waiting = lock.clone().wait(Duration::from_secs(5));
        let inside = Inside::default();
        let entry = |lock: &Lock, inside: &Inside| {
            let (lock, inside) = (lock.clone(), inside.clone());
            async move { lock.run(inside.body(10)).await }
        };

        lock.run(async {
            // Sequential nesting: straight in, no round trip.
            let nested = lock.acquire().await.unwrap();
            assert!(nested.is_reentrant());
            nested.release().await.unwrap();

            // join!: one at a time with `wait`; without it, the second is
            // busy, as it would be without the outer hold.
            let (a, b) = tokio::join!(entry(&waiting, &inside), entry(&waiting, &inside));
            a.unwrap();
            b.unwrap();
            assert_eq!(inside.most(), 1, "join!: two entries at once");
            let (a, b) = tokio::join!(entry(&lock, &inside), entry(&lock, &inside));
            assert!(
                a.is_ok() != b.is_ok(),
                "join! without wait: exactly one enters ({a:?}, {b:?})"
            );
            assert!(matches!(a.err().or(b.err()), Some(LockError::Busy { .. })));

            // select!: both start; never both inside.
            tokio::select! {
                result = entry(&waiting, &inside) => result.unwrap(),
                result = entry(&waiting, &inside) => result.unwrap(),
            }
            assert_eq!(inside.most(), 1, "select!: two entries at once");

            // FuturesUnordered: all five run, one at a time.
            let mut all: FuturesUnordered<_> = (0..5).map(|_| entry(&waiting, &inside)).collect();
            let mut done = 0;
            while let Some(result) = all.next().await {
                result.unwrap();
                done += 1;
            }
            assert_eq!((done, inside.most()), (5, 1), "FuturesUnordered");

            // Another task: excluded like any other holder.
            let spawned = tokio::spawn({
                let lock = lock.clone();
                async move { lock.try_acquire().await.map(drop) }
            });
            assert!(matches!(
                spawned.await.unwrap(),
                Err(LockError::Busy { .. })
            ));

            // A task spawned on a LocalSet that the body drives is polled
            // inside the body, but it is another task: excluded, and it does
            // not see the lock as its own.
            let local = tokio::task::LocalSet::new();
            let (seen, result) = local
                .run_until({
                    let lock = lock.clone();
                    async move {
                        tokio::task::spawn_local(async move {
                            (current().is_some(), lock.try_acquire().await.map(drop))
                        })
                        .await
                        .unwrap()
                    }
                })
                .await;
            assert!(!seen, "a local task saw the body's lock as its own");
            assert!(
                matches!(result, Err(LockError::Busy { .. })),
                "a local task entered: {result:?}"
            );

            // block_in_place: the holder blocks until the nested call ends,
            // which is nesting: it goes straight in.
            let nested = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(lock.run(async { current().map(|held| held.name().to_owned()) }))
            });
            assert_eq!(nested.unwrap().as_deref(), Some("matrix"));
        })
        .await
        .unwrap();
        assert_eq!(inside.most(), 1);
        assert_eq!(redis(&server, &["EXISTS", "lock:{matrix}"]), ":0\r\n");
    });
}

/// A reentrant body that is still running when its outer hold ends is
/// stopped at its next poll, and reported; it never runs on outside the
/// lock.
#[test]
#[allow(clippy::async_yields_async)] // the body hands its inner future out: the point
fn a_reentrant_body_never_outlives_its_outer_hold() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = client(&server);
        let lock = Lock::new("outlived").client(client.clone());
        let steps = Arc::new(AtomicUsize::new(0));
        let escaped = lock
            .run(async {
                let steps = Arc::clone(&steps);
                let inner_lock = lock.clone();
                let mut inner = Box::pin(async move {
                    inner_lock
                        .run(async move {
                            steps.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            // Never reached: the outer hold ended meanwhile.
                            steps.fetch_add(1, Ordering::SeqCst);
                        })
                        .await
                });
                // Polled once inside the outer body: it re-enters and starts.
                let first = futures_util::future::poll_immediate(inner.as_mut()).await;
                assert!(first.is_none());
                inner
            })
            .await
            .unwrap();
        assert_eq!(steps.load(Ordering::SeqCst), 1);
        // The outer hold is released; another holder may take the key.
        let other = Lock::new("outlived")
            .client(super_client(&server))
            .try_acquire()
            .await
            .unwrap();
        let outcome = escaped.await;
        assert!(
            matches!(
                outcome,
                Err(LockError::Lost {
                    cause: lock_runtime::LostCause::Released,
                    ..
                })
            ),
            "{outcome:?}"
        );
        assert_eq!(
            steps.load(Ordering::SeqCst),
            1,
            "the body ran on after its hold ended"
        );
        other.release().await.unwrap();
    });
}

/// Another instance: its own client.
fn super_client(server: &RedisServer) -> lock_runtime::Client {
    client(server)
}

#[test]
fn handles_that_outlive_the_hold_see_it_released() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = lock_runtime::Client::new(lock_runtime::Config::new(server.url())).unwrap();
        let lock = Lock::new("escaped").client(client);
        let outer = lock.acquire().await.unwrap();
        let (inner, seen) = outer
            .run(async { (lock.acquire().await.unwrap(), current().unwrap()) })
            .await
            .unwrap();
        assert!(inner.is_reentrant() && inner.is_held() && seen.is_held());
        outer.release().await.unwrap();
        assert!(
            !inner.is_held() && !seen.is_held(),
            "the outer hold was released"
        );
        assert_eq!(inner.lost_cause(), Some(lock_runtime::LostCause::Released));
    });
}

#[test]
fn fencing_is_issued_only_when_asked_and_reentry_cannot_invent_one() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = lock_runtime::Client::new(lock_runtime::Config::new(server.url())).unwrap();
        let plain = Lock::new("invoice:9").client(client.clone());
        let outer = plain.acquire().await.unwrap();
        assert_eq!(outer.fencing_token(), None);
        assert_eq!(
            redis(&server, &["EXISTS", "lock:{invoice:9}:fence"]),
            ":0\r\n",
            "a lock taken without fencing touches no fence key"
        );
        // An inner entry asking for a token its outer hold never got fails
        // rather than hand out none.
        let inner = outer.run(plain.clone().fencing().acquire()).await.unwrap();
        match inner {
            Err(LockError::Config(ConfigError::Reentry { name, reason })) => {
                assert_eq!(name, "invoice:9");
                assert!(
                    reason.contains("add `fencing` to the outer lock"),
                    "{reason}"
                )
            }
            other => panic!("expected a config error, got {other:?}"),
        }
        outer.release().await.unwrap();

        let fenced = plain.fencing();
        let first = fenced.acquire().await.unwrap();
        let first_token = first.fencing_token().expect("taken with fencing");
        first.release().await.unwrap();
        let second = fenced.acquire().await.unwrap();
        assert!(second.fencing_token().expect("taken with fencing") > first_token);
        second.release().await.unwrap();
    });
}

/// Under a manual reentrant guard (`acquire()` inside a body), a further
/// entry cannot tell whether it is nested in that guard (waiting would wait
/// for itself) or beside it: it fails at once with a message saying to use
/// `guard.run(..)`, however long its wait; nesting through `guard.run`
/// goes in.
#[test]
fn entries_under_a_manual_guard_fail_fast_and_guard_run_nests() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = client(&server);
        let lock = Lock::new("manual").client(client);
        lock.run(async {
            let guard = lock.acquire().await.unwrap();
            assert!(guard.is_reentrant());
            for nested in [lock.clone(), lock.clone().wait(Duration::MAX)] {
                let outcome = tokio::time::timeout(LINE_TIMEOUT, nested.run(async {}))
                    .await
                    .expect("a nested entry waited for its own guard");
                match outcome {
                    Err(LockError::Config(ConfigError::Reentry { reason, .. })) => {
                        assert!(reason.contains("guard.run"), "{reason}")
                    }
                    other => panic!("expected a config error, got {other:?}"),
                }
            }
            let nested = guard
                .run(async { lock.run(async { current().is_some() }).await })
                .await
                .unwrap();
            assert!(nested.unwrap(), "nesting through guard.run goes in");
            guard.release().await.unwrap();
        })
        .await
        .unwrap();
    });
}

/// A body moved to another task after it started keeps its call chain:
/// `current()` and reentry follow the task that polls it.
#[test]
fn a_body_moved_to_another_task_keeps_its_chain() {
    let server = RedisServer::start();
    let runtime = two_workers();
    runtime.block_on(async {
        let client = client(&server);
        let lock = Lock::new("moved").client(client);
        let started = Arc::new(tokio::sync::Notify::new());
        let mut body = Box::pin({
            let (lock, started) = (lock.clone(), Arc::clone(&started));
            async move {
                let outer = lock.clone();
                outer
                    .run(async move {
                        started.notify_one();
                        tokio::task::yield_now().await;
                        let nested = lock.run(async {}).await;
                        (current().is_some(), nested.is_ok())
                    })
                    .await
            }
        });
        // Started in this task (the body is inside its lock), then finished
        // in another.
        tokio::select! {
            biased;
            _ = started.notified() => {}
            _ = &mut body => unreachable!("the body waits for one more poll"),
        }
        let (seen, nested) = tokio::spawn(body).await.unwrap().unwrap();
        assert!(seen, "current() lost the lock after the move");
        assert!(nested, "reentry refused after the move");
    });
}

/// An inner entry cannot add what the outer hold it shares lacks: `renew`
/// (an inner body would outlive the outer ttl unprotected) and
/// `hold_at_least`, like `fencing`, are configuration errors.
#[test]
fn an_inner_entry_cannot_ask_for_more_than_its_outer_hold() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = client(&server);
        let plain = Lock::new("more").client(client);
        plain
            .run(async {
                for (what, inner) in [
                    ("renew", plain.clone().renew()),
                    (
                        "hold_at_least",
                        plain.clone().hold_at_least(Duration::from_secs(1)),
                    ),
                ] {
                    match inner.run(async {}).await {
                        Err(LockError::Config(ConfigError::Reentry { reason, .. })) => {
                            assert!(reason.contains(what), "{reason}")
                        }
                        other => panic!("{what}: expected a config error, got {other:?}"),
                    }
                }
            })
            .await
            .unwrap();
    });
}
