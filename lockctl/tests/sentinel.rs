//! lockctl through Redis Sentinel (`redis-sentinel://`, test-support's
//! primary, two replicas and three sentinels): `list` and `show` see a
//! lock held and waited for through the sentinels, and `release --force`
//! frees it there, waking the waiter.

mod common;
use common::*;

use std::time::Duration;

use lock_runtime::Lock;
use test_support::RedisSentinel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_release_through_the_sentinels() {
    let setup = RedisSentinel::start();
    let url = setup.url("");
    let primary = setup.primary().unwrap();
    let (holder, other) = (client(&url), client(&url));
    let guard = Lock::new("order:42")
        .ttl(Duration::from_secs(60))
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let token = guard.token().to_owned();
    let waiter = spawn_waiter(&other, "order:42");
    let queued =
        || test_support::command(primary, &["LLEN", "lock:{order:42}:queue"]).unwrap() == ":1\r\n";
    let deadline = std::time::Instant::now() + PATIENCE;
    while !queued() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let list = list_until(&url, "the lock is listed with its holder", |list| {
        row(&list.stdout, "order:42").is_some_and(|row| row["INSTANCE"] == holder.instance())
    })
    .await;
    assert_eq!(
        row(&list.stdout, "order:42").unwrap()["HOLDER"],
        token[..8],
        "{list:?}"
    );
    let show = lockctl(&url, &["show", "order:42"], "").await;
    assert_eq!(show.code, 0, "{show:?}");
    assert!(
        show.stdout.contains(&format!("holder:   {token}")),
        "{show:?}"
    );
    assert!(show.stdout.contains("waiters:  1"), "{show:?}");

    let release = lockctl(&url, &["release", "order:42", "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    let woken = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter is woken")
        .unwrap()
        .expect("the waiter gets the lock");
    woken.release().await.unwrap();
    assert!(
        guard.release().await.is_err(),
        "the forced release freed it"
    );
}
