//! Reentrancy: a call chain in one task that enters the same key again.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{current, distributed_lock, Lock, LockError};

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

#[distributed_lock(key = "tree:<name>", renew, ttl = "300ms")]
async fn walk(name: &str, depth: u32) -> Result<u32, LockError> {
    if depth == 0 {
        // Deep inside, the renewed outer hold is still held past its ttl.
        tokio::time::sleep(Duration::from_millis(700)).await;
        return Ok(current().map_or(0, |lock| u32::from(lock.is_held())));
    }
    Ok(1 + Box::pin(walk(name, depth - 1)).await?)
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
    });
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
            Err(LockError::Config { message }) => {
                assert!(
                    message.contains("add `fencing` to the outer lock"),
                    "{message}"
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
