//! In-process hand-off under faults: the task a lock is passed to never runs
//! while another client holds the key or may take it, and a pass that does
//! not complete never leaves the next holder hanging. (The first four were
//! written by a review of a first "early pass", which woke the next task
//! before the HANDOFF reply: each failed with it, and it was withdrawn; the
//! early pass of today answers them; see docs/design.md §4.)

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// A renewed holder whose renewal found the key taken by another client is
/// stopped, and `Lock::run` drops its guard: the loss is known, so the next
/// task of the process must not start while the other client holds the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_known_lost_does_not_start_the_next_task() {
    let server = RedisServer::start();
    let client = client(&server);
    let key = "known-lost";
    let first = Lock::new(key)
        .client(self::client(&server))
        .acquire()
        .await
        .unwrap();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(6))
            .renew()
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move {
            lock.run(async {
                let _ = started_tx.send(());
                std::future::pending::<()>().await
            })
            .await
        }
    });
    wait_until_async("the holder waits in Redis", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{known-lost}:queue"]) == ":1\r\n"
    })
    .await;
    first.release().await.unwrap();
    started.await.unwrap();
    let seen = Arc::new(Mutex::new(None::<(String, String)>));
    let waiter = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(6))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        let (seen, url) = (Arc::clone(&seen), server.port());
        async move {
            lock.run(async move {
                let token = lock_runtime::current().unwrap().token().to_owned();
                let held = test_support::command(url, &["GET", "lock:{known-lost}"]).unwrap();
                *seen.lock().unwrap() = Some((value(&held).unwrap_or_default(), token));
            })
            .await
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process(key) == 1
    })
    .await;
    // Another client's token: the holder's next renewal (2 s) finds it.
    redis(
        &server,
        &["SET", "lock:{known-lost}", "intruder", "PX", "4000"],
    );
    let outcome = tokio::time::timeout(LINE_TIMEOUT, holder)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.is_err(), "{outcome:?}");
    // Give the waiter a moment to start, if it was (wrongly) passed the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen_now = seen.lock().unwrap().clone();
    if let Some((held, token)) = seen_now {
        assert!(
            held.starts_with(&token),
            "the next task ran while the key held {held:?} (its token {token})"
        );
    }
    let _ = tokio::time::timeout(LINE_TIMEOUT, waiter).await;
}

/// `release()` cancelled while its hand-off task waits to retry a HANDOFF
/// whose connection broke: whatever the guard's drop sends, the next task
/// must not be inside its section while another client can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_does_not_free_the_key_under_the_next_task() {
    let server = RedisServer::start();
    let proxy = test_support::Proxy::start(server.port());
    let client = Client::new(Config::new(proxy.url())).unwrap();
    let key = "cancelled";
    let holder = cohort_holder(&server, &client, key, Duration::from_secs(30)).await;
    let inside = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        let inside = Arc::clone(&inside);
        async move {
            lock.run(async move {
                inside.store(true, Ordering::SeqCst);
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_secs(1)).await;
                inside.store(false, Ordering::SeqCst);
            })
            .await
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process(key) == 1
    })
    .await;
    proxy.stall();
    let release = tokio::spawn(holder.release());
    // Told at once with the early pass (before it, the next task waited for
    // the HANDOFF's answer).
    let _ = tokio::time::timeout(Duration::from_millis(300), started).await;
    // The HANDOFF, stalled, never reaches Redis: its connection breaks and it
    // is retried 5 ms later. The caller gives up on `release()` meanwhile.
    proxy.drop_all();
    proxy.resume();
    release.abort();
    let probe = Lock::new(key)
        .ttl(Duration::from_secs(1))
        .client(self::client(&server));
    let until = Instant::now() + Duration::from_millis(600);
    let mut taken_while_inside = false;
    while Instant::now() < until {
        if let Ok(guard) = probe.try_acquire().await {
            taken_while_inside = inside.load(Ordering::SeqCst);
            let _ = guard.release().await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _ = waiter.await;
    assert!(
        !taken_while_inside,
        "another client took the key while the task passed the lock was inside"
    );
}

/// A HANDOFF without an answer (timed out): both tokens are released in the
/// background, so the task the lock was meant for must not be inside its
/// section when another client takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_timeout_does_not_free_the_key_under_the_running_task() {
    let server = RedisServer::start();
    let proxy = test_support::Proxy::start(server.port());
    let client = Client::new(
        Config::new(proxy.url())
            .connect_timeout(Duration::from_millis(100))
            .response_timeout(Duration::from_millis(100)),
    )
    .unwrap();
    let key = "timeout";
    let holder = cohort_holder(&server, &client, key, Duration::from_secs(30)).await;
    let inside = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        let inside = Arc::clone(&inside);
        async move {
            lock.run(async move {
                inside.store(true, Ordering::SeqCst);
                let held = lock_runtime::current().unwrap();
                let _ = started_tx.send(held.remaining());
                tokio::time::sleep(Duration::from_secs(2)).await;
                inside.store(false, Ordering::SeqCst);
            })
            .await
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process(key) == 1
    })
    .await;
    proxy.stall();
    let release = tokio::spawn(holder.release());
    // Told at once with the early pass (before it, the next task waited for
    // the HANDOFF's answer, and went to Redis without one).
    let remaining = tokio::time::timeout(Duration::from_millis(150), started)
        .await
        .ok()
        .and_then(Result::ok);
    // The HANDOFF's deadline (200 ms) passes while stalled.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.resume();
    let outcome = release.await.unwrap();
    eprintln!("passer's release: {outcome:?}");
    let probe = Lock::new(key)
        .ttl(Duration::from_secs(1))
        .client(self::client(&server));
    let until = Instant::now() + Duration::from_millis(1000);
    let mut taken_while_inside = false;
    while Instant::now() < until {
        if let Ok(guard) = probe.try_acquire().await {
            taken_while_inside = inside.load(Ordering::SeqCst);
            let _ = guard.release().await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = waiter.await;
    assert!(
        !taken_while_inside,
        "another client took the key while the task passed the lock (told it had {remaining:?}) was inside"
    );
}

/// The hand-off task runs on the runtime of the passer; if that runtime shuts
/// down before the HANDOFF's answer, the next holder (on another runtime of
/// the same client) must not be left waiting forever.
#[test]
fn a_pass_dropped_unsettled_does_not_hang_the_next_holder() {
    let server = RedisServer::start();
    let proxy = test_support::Proxy::start(server.port());
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = main.block_on(async {
        let client = Client::new(Config::new(proxy.url())).unwrap();
        // First used here: the connection's I/O task lives on `main`.
        Lock::new("warm")
            .client(client.clone())
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        client
    });
    let key = "runtimes";
    let secondary = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let holder = secondary.block_on(cohort_holder(
        &server,
        &client,
        key,
        Duration::from_secs(30),
    ));
    let (told_tx, told) = tokio::sync::oneshot::channel();
    let waiter = main.spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move {
            let guard = lock.acquire().await.unwrap();
            let _ = told_tx.send(());
            tokio::time::timeout(Duration::from_secs(5), guard.release()).await
        }
    });
    main.block_on(wait_until_async(
        "the waiter queues in the process",
        LINE_TIMEOUT,
        || client.waiting_in_process(key) == 1,
    ));
    proxy.stall();
    secondary.block_on(async {
        let release = tokio::spawn(holder.release());
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(release);
    });
    drop(secondary); // the hand-off task is dropped with it, unsettled
    proxy.resume();
    let told = main.block_on(async { tokio::time::timeout(Duration::from_secs(3), told).await });
    if told.is_err() {
        // Not passed early (the cohort ended with the hand-off task): the
        // waiter waits in Redis for the 30 s key; nothing can hang.
        waiter.abort();
        return;
    }
    let outcome = main.block_on(waiter).unwrap();
    assert!(
        outcome.is_ok(),
        "the next holder's release hung waiting for a pass nobody settles"
    );
}

/// A task passed the lock early releases it while the `HANDOFF` is stuck
/// (its connection stalls, then breaks, and both are retried on a fresh
/// one): its release waits for the `HANDOFF`'s outcome, so it is told the
/// truth (released) and the key is free at once, not left with either
/// token until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_lock_passed_early_waits_for_its_handoff() {
    let server = RedisServer::start();
    let proxy = test_support::Proxy::start(server.port());
    let client = Client::new(Config::new(proxy.url())).unwrap();
    let key = "early-release";
    let holder = cohort_holder(&server, &client, key, Duration::from_secs(30)).await;
    let waiter = tokio::spawn({
        let lock = Lock::new(key)
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move { lock.acquire().await.unwrap() }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process(key) == 1
    })
    .await;
    proxy.stall();
    let passing = tokio::spawn(holder.release());
    let guard = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("passed early, while the connection stalls")
        .unwrap();
    let releasing = tokio::spawn(guard.release());
    // Give the release time to be sent (or to wait), then break the stalled
    // connection: whatever was sent on it is retried on a fresh one.
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.drop_all();
    proxy.resume();
    let released = tokio::time::timeout(LINE_TIMEOUT, releasing)
        .await
        .unwrap()
        .unwrap();
    assert!(released.is_ok(), "{released:?}");
    let _ = tokio::time::timeout(LINE_TIMEOUT, passing).await;
    wait_until_async("the lock is free", Duration::from_secs(2), || {
        redis(&server, &["EXISTS", "lock:{early-release}"]) == ":0\r\n"
    })
    .await;
}
