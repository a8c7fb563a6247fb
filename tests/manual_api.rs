//! The manual API on a real Redis: try, wait, release, drop, cancellation.

mod common;
use common::*;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use lock_runtime::{Client, Config, ConfigError, Lock, LockError, LostCause};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

#[tokio::test]
async fn try_acquire_sets_token_and_ttl_then_release_deletes() {
    let server = RedisServer::start();
    let lock = Lock::new("order:1")
        .ttl(Duration::from_secs(10))
        .client(client(&server));
    let asked = std::time::Instant::now();
    let guard = lock.try_acquire().await.unwrap();
    assert_eq!(guard.redis_key(), "lock:{order:1}");
    assert_eq!(guard.token().len(), 32);
    assert!(guard.token().chars().all(|c| c.is_ascii_hexdigit()));
    assert!(guard.remaining() <= Duration::from_secs(10));
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{order:1}"])).as_deref(),
        Some(guard.token())
    );
    let pttl: i64 = value(&redis(&server, &["PTTL", "lock:{order:1}"]))
        .unwrap()
        .parse()
        .unwrap();
    // 10 s from when it was taken (since `asked`).
    let since = asked.elapsed().as_millis() as i64;
    assert!(
        pttl >= 10_000 - since - 5 && pttl <= 10_000,
        "{pttl} ms left {since} ms after asking"
    );

    let busy = lock.try_acquire().await.unwrap_err();
    assert!(
        matches!(busy, LockError::Busy { ref name } if name == "order:1"),
        "{busy:?}"
    );
    assert!(busy.to_string().contains("wait"), "{busy}");

    guard.release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{order:1}"]), ":0\r\n");
}

#[tokio::test]
async fn every_acquisition_gets_a_fresh_token() {
    let server = RedisServer::start();
    let lock = Lock::new("tokens").client(client(&server));
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        let guard = lock.try_acquire().await.unwrap();
        assert!(seen.insert(guard.token().to_owned()));
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_waiter_gets_the_lock_after_release() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = Lock::new("queue")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock = Lock::new("queue").client(client.clone()).wait(LINE_TIMEOUT);
        async move { lock.acquire().await }
    });
    // It waits (in Redis, or in the process behind a holder of its client).
    wait_until_async("the waiter waits", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{queue}:queue"]) == ":1\r\n"
            || client.waiting_in_process("queue") == 1
    })
    .await;
    holder.release().await.unwrap();
    let guard = waiter.await.unwrap().expect("the waiter gets the lock");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_takes_over_an_abandoned_lock_after_its_ttl() {
    let server = RedisServer::start();
    let client = client(&server);
    let abandoned = Lock::new("crashed")
        .ttl(Duration::from_millis(300))
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    // A holder that vanishes without releasing (a crash): nothing is sent.
    std::mem::forget(abandoned);
    let guard = Lock::new("crashed")
        .client(client)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("taken over after expiry");
    guard.release().await.unwrap();
}

#[tokio::test]
async fn wait_gives_up_with_wait_timeout() {
    let server = RedisServer::start();
    let client = client(&server);
    let _holder = Lock::new("busy")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let error = Lock::new("busy")
        .client(client)
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap_err();
    match error {
        LockError::WaitTimeout { waited, .. } => assert!(waited >= Duration::from_millis(100)),
        other => panic!("{other:?}"),
    }
}

// Multi-threaded: the background release runs while this thread blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_in_the_background() {
    let server = RedisServer::start();
    let guard = Lock::new("dropped")
        .client(client(&server))
        .try_acquire()
        .await
        .unwrap();
    drop(guard);
    wait_until("the dropped guard's key is deleted", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{dropped}"]) == ":0\r\n"
    });
}

// Current-thread: nothing else runs while the release is polled, so its
// first poll is certain to leave it in flight.
#[tokio::test]
async fn a_cancelled_release_still_releases() {
    let server = RedisServer::start();
    let guard = Lock::new("cancelled")
        .client(client(&server))
        .try_acquire()
        .await
        .unwrap();
    let mut release = Box::pin(guard.release());
    let first_poll = std::future::poll_fn(|cx| Poll::Ready(release.as_mut().poll(cx))).await;
    assert!(
        first_poll.is_pending(),
        "the release was meant to be cut off"
    );
    drop(release);
    wait_until_async(
        "the cancelled release's lock is deleted",
        LINE_TIMEOUT,
        || redis(&server, &["EXISTS", "lock:{cancelled}"]) == ":0\r\n",
    )
    .await;
}

// Current-thread, as above: the acquire's first poll leaves its SET in flight.
#[tokio::test]
async fn a_cancelled_acquire_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("abandoned").client(client.clone());
    let mut acquire = Box::pin(lock.try_acquire());
    let first_poll = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
    assert!(
        first_poll.is_pending(),
        "the acquire was meant to be cut off"
    );
    drop(acquire);
    // Whether or not the SET was applied, no lock is left behind. A round
    // trip of the same client, sent after the SET, has its answer only once
    // the SET (if it was sent) ran.
    Lock::new("barrier")
        .client(client)
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    wait_until_async("the cancelled acquire's lock is gone", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{abandoned}"]) == ":0\r\n"
    })
    .await;
    lock.try_acquire()
        .await
        .expect("the lock is free")
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn release_survives_a_script_cache_flush() {
    let server = RedisServer::start();
    let lock = Lock::new("flushed").client(client(&server));
    lock.try_acquire().await.unwrap().release().await.unwrap();
    let guard = lock.try_acquire().await.unwrap();
    assert_eq!(redis(&server, &["SCRIPT", "FLUSH"]), "+OK\r\n");
    guard
        .release()
        .await
        .expect("NOSCRIPT is handled by loading the script again");
    assert_eq!(redis(&server, &["EXISTS", "lock:{flushed}"]), ":0\r\n");
}

#[tokio::test]
async fn release_never_deletes_another_holders_lock() {
    let server = RedisServer::start();
    let guard = Lock::new("stolen")
        .client(client(&server))
        .try_acquire()
        .await
        .unwrap();
    // Simulate expiry followed by another holder's acquisition.
    redis(
        &server,
        &["SET", "lock:{stolen}", "someone-else", "PX", "30000"],
    );
    let error = guard.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Replaced,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{stolen}"])).as_deref(),
        Some("someone-else")
    );
}

#[tokio::test]
async fn run_holds_the_lock_only_while_the_body_runs() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("job").client(client.clone());
    let during = lock
        .run(async { redis(&server, &["EXISTS", "lock:{job}"]) })
        .await
        .unwrap();
    assert_eq!(during, ":1\r\n");
    assert_eq!(redis(&server, &["EXISTS", "lock:{job}"]), ":0\r\n");

    let _holder = lock.try_acquire().await.unwrap();
    let mut ran = false;
    let error = lock.run(async { ran = true }).await.unwrap_err();
    assert!(error.is_busy());
    assert!(!ran, "the body must not run when the lock is busy");
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let server = RedisServer::start();
    let client = client(&server);
    let zero = Lock::new("z")
        .ttl(Duration::ZERO)
        .client(client.clone())
        .try_acquire()
        .await;
    assert!(matches!(
        zero,
        Err(LockError::Config(ConfigError::InvalidTtl {
            ttl: Duration::ZERO,
            ..
        }))
    ));
    let empty = Lock::new("").client(client.clone()).try_acquire().await;
    assert!(
        matches!(empty, Err(LockError::Config(ConfigError::InvalidName { ref reason, .. })) if reason.contains("empty"))
    );
    let huge = Lock::new("h")
        .ttl(Duration::MAX)
        .client(client.clone())
        .try_acquire()
        .await;
    assert!(matches!(
        huge,
        Err(LockError::Config(ConfigError::InvalidTtl {
            ttl: Duration::MAX,
            ..
        }))
    ));
    let brace = Lock::new("}x").client(client.clone()).try_acquire().await;
    assert!(
        matches!(brace, Err(LockError::Config(ConfigError::InvalidName { ref name, .. })) if name == "}x")
    );
    let prefix = Client::new(Config::new(server.url()).key_prefix("app{1}:"));
    assert!(matches!(
        prefix,
        Err(LockError::Config(ConfigError::InvalidClientOption {
            option: "key_prefix",
            ..
        }))
    ));
    // "Wait forever" is a valid wait.
    let forever = Lock::new("w")
        .wait(Duration::MAX)
        .client(client)
        .acquire()
        .await;
    forever.unwrap().release().await.unwrap();
}

#[test]
fn lock_errors_convert_to_io_errors() {
    use std::io::ErrorKind;
    let busy: std::io::Error = LockError::Busy { name: "k".into() }.into();
    assert_eq!(busy.kind(), ErrorKind::WouldBlock);
    let timeout: std::io::Error = LockError::WaitTimeout {
        name: "k".into(),
        waited: Duration::from_secs(1),
    }
    .into();
    assert_eq!(timeout.kind(), ErrorKind::TimedOut);
    assert!(timeout.to_string().contains("`k`"));
}
