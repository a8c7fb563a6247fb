//! A Redis that is down, silent or restarted: errors come within the
//! configured timeout, never a hang, and the client recovers.

mod common;
use common::*;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, ConfigError, Lock, LockError};

/// connect 500 ms + response 500 ms: a call fails after at most ~1 s.
fn quick_client(url: String) -> Client {
    Client::new(
        Config::new(url)
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500)),
    )
    .unwrap()
}

/// The configured 1 s plus slack for a loaded 2-core machine; far below the
/// tens of seconds that stacked default retries take.
const BOUND: Duration = Duration::from_secs(5);

/// How long the waiting acquire below waits.
const WAIT: Duration = Duration::from_millis(1500);

/// A try-once acquire fails with a Redis error, fast; a waiting one keeps
/// trying through the errors for its whole wait (Redis may come back), then
/// fails with the Redis error, not with a timeout that would blame a holder.
async fn assert_fails_fast(client: Client) -> Vec<LockError> {
    let mut errors = Vec::new();
    for (lock, bound) in [
        (Lock::new("down").client(client.clone()), BOUND),
        (Lock::new("down").client(client).wait(WAIT), WAIT + BOUND),
    ] {
        let started = Instant::now();
        let error = lock.acquire().await.expect_err("Redis is not answering");
        assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
        assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
        if bound > BOUND {
            // The waiting one kept trying until its wait ended.
            assert!(
                started.elapsed() >= WAIT,
                "a waiting acquire gave up after {:?} of its {WAIT:?}",
                started.elapsed()
            );
        }
        errors.push(error);
    }
    errors
}

#[tokio::test]
async fn refused_port_fails_within_the_timeout() {
    // Nothing accepts connections there, and no other test's server can
    // take the port meanwhile.
    let refused = test_support::RefusedPort::new().unwrap();
    let port = refused.port();
    for error in assert_fails_fast(quick_client(format!("redis://127.0.0.1:{port}/"))).await {
        assert!(error.to_string().contains("acquire"), "{error}");
    }
}

#[tokio::test]
async fn silent_listener_fails_within_the_timeout() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        while stopped.try_recv().is_err() {
            if let Ok((socket, _)) = listener.accept() {
                held.push(socket);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert_fails_fast(quick_client(format!("redis://127.0.0.1:{port}/"))).await;
    stop.send(()).unwrap();
    holder.join().unwrap();
}

#[tokio::test]
async fn passwords_never_appear_in_errors_or_debug() {
    // Nothing accepts connections there, and no other test's server can
    // take the port meanwhile.
    let refused = test_support::RefusedPort::new().unwrap();
    let port = refused.port();
    let url = format!("redis://app:hunter2secret@127.0.0.1:{port}/");
    let config = Config::new(url.clone());
    assert!(!format!("{config:?}").contains("hunter2secret"));
    let client = quick_client(url);
    assert!(!format!("{client:?}").contains("hunter2secret"));
    let error = Lock::new("x").client(client).acquire().await.unwrap_err();
    assert!(
        !format!("{error} {error:?}").contains("hunter2secret"),
        "{error:?}"
    );

    let bad = Client::new(Config::new("redis://app:hunter2secret@[not-a-host/")).unwrap_err();
    assert!(matches!(bad, LockError::Config { .. }), "{bad:?}");
    assert!(
        !format!("{bad} {bad:?}").contains("hunter2secret"),
        "{bad:?}"
    );
}

#[tokio::test]
async fn the_client_recovers_after_a_restart() {
    let mut server = RedisServer::start();
    let port = server.port();
    let client = quick_client(server.url());
    let lock = Lock::new("restart").client(client);
    lock.acquire().await.unwrap().release().await.unwrap();

    server.kill();
    let error = lock.acquire().await.expect_err("server is down");
    assert!(matches!(error, LockError::Redis { .. }), "{error:?}");

    let _server = RedisServer::start_on(port).expect("restart on the same port");
    // Tries until the client reconnected (errors until then), for a
    // bounded time.
    let deadline = Instant::now() + LINE_TIMEOUT;
    let recovered = loop {
        match lock.acquire().await {
            Ok(guard) => break guard,
            Err(LockError::Redis { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(other) => panic!("not reconnected within {LINE_TIMEOUT:?}: {other:?}"),
        }
    };
    recovered.release().await.unwrap();
}

/// A login Redis refused is not kept: the next call opens a connection
/// again, so a client started before its password was set on the server
/// (or rotated there) works as soon as Redis takes it, without a restart.
#[tokio::test]
async fn a_refused_login_is_tried_again_by_the_next_call() {
    let server = RedisServer::start();
    let set_user = |password: &str| {
        let reply = server
            .command(&["ACL", "SETUSER", "app", "on", password, "~*", "&*", "+@all"])
            .unwrap();
        assert!(reply.starts_with("+OK"), "{reply}");
    };
    set_user(">before");
    let port = server.port();
    let client = quick_client(format!("redis://app:after@127.0.0.1:{port}/"));
    let lock = Lock::new("login").client(client);
    let refused = lock.acquire().await.expect_err("the password is wrong");
    assert!(matches!(refused, LockError::Redis { .. }), "{refused:?}");
    // The same refusal again: nothing changed on the server.
    let again = lock
        .acquire()
        .await
        .expect_err("the password is still wrong");
    assert!(matches!(again, LockError::Redis { .. }), "{again:?}");

    set_user(">after");
    let guard = lock
        .acquire()
        .await
        .expect("the server takes the client's password now");
    guard.release().await.unwrap();
}

#[test]
fn missing_url_says_what_to_set() {
    let mut worker = Process::spawn(env!("CARGO_BIN_EXE_lock-worker"), &["try", "k"], None);
    let line = worker.line(LINE_TIMEOUT);
    assert!(line.starts_with("error: "), "{line}");
    assert!(
        line.contains("REDIS_URL") && line.contains("lock_runtime::init"),
        "{line}"
    );
}

/// A password with characters a URL should have escaped (`/`, `?`, `#`)
/// never appears either: not in `Config`'s Debug, not in the error that
/// rejects the URL.
#[tokio::test]
async fn unescaped_passwords_never_appear() {
    for url in [
        "redis://default:pa/ss-hunter2@127.0.0.1:6379/0",
        "redis://default:pa?ss-hunter2@127.0.0.1:6379",
        "redis://default:pa#ss-hunter2@127.0.0.1:6379",
        "redis://:p@ss/hunter2@127.0.0.1/1",
    ] {
        let config = Config::new(url);
        assert!(!format!("{config:?}").contains("hunter2"), "{config:?}");
        assert!(!config.redacted_url().contains("hunter2"));
        match Client::new(config) {
            Ok(client) => assert!(!format!("{client:?}").contains("hunter2")),
            Err(error) => assert!(
                !format!("{error} {error:?}").contains("hunter2"),
                "{error:?}"
            ),
        }
        if let Err(error) = lock_runtime::init(url) {
            assert!(
                !format!("{error} {error:?}").contains("hunter2"),
                "{error:?}"
            );
        }
    }
}

/// Timeouts out of range are configuration errors, not panics later (an
/// `Instant` overflow) or calls that can never succeed (zero).
#[tokio::test]
async fn timeouts_out_of_range_are_rejected() {
    for config in [
        Config::new("redis://127.0.0.1:1/").connect_timeout(Duration::MAX),
        Config::new("redis://127.0.0.1:1/").response_timeout(Duration::from_secs(u64::MAX / 2)),
        Config::new("redis://127.0.0.1:1/").connect_timeout(Duration::ZERO),
        Config::new("redis://127.0.0.1:1/").response_timeout(Duration::from_micros(10)),
    ] {
        match Client::new(config) {
            Err(LockError::Config(ConfigError::InvalidClientOption { option, .. })) => {
                assert!(option.ends_with("_timeout"), "{option}")
            }
            other => panic!("expected a config error, got {other:?}"),
        }
    }
}

/// Issue 36, hole 8: no call outlives its bounds (its wait, then one call
/// deadline) by more than a round trip (design §3). A SIGSTOPped server
/// (its connection open, nothing answers; connect 1 s + response 1 s, so a
/// call deadline of 2 s): a try, and a waiting lock, read share, write lock
/// and permit with a 200 ms wait each fail with the Redis error within
/// 200 ms + 2 s, plus slack. Before, a waiting call's first `SET NX` timed
/// out at 2 s and a waiting attempt was sent anyway, though its wait was
/// over: 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_on_a_stopped_server_ends_one_call_deadline_after_its_wait() {
    use lock_runtime::{RwLock, Semaphore};
    let server = RedisServer::start();
    let client = Client::new(
        Config::new(server.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let deadline = Duration::from_secs(2);
    Lock::new("warm")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    signal(&server, "-STOP");
    let wait = Duration::from_millis(200);
    type Call = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LockError>> + Send>>;
    let calls: Vec<(&str, Duration, Call)> = vec![
        ("a try", Duration::ZERO, {
            let lock = Lock::new("stopped").client(client.clone());
            Box::pin(async move { lock.try_acquire().await.map(drop) })
        }),
        ("a waiting lock", wait, {
            let lock = Lock::new("stopped").wait(wait).client(client.clone());
            Box::pin(async move { lock.acquire().await.map(drop) })
        }),
        ("a waiting body", wait, {
            let lock = Lock::new("stopped").wait(wait).client(client.clone());
            Box::pin(async move { lock.run(async {}).await })
        }),
        ("a waiting read share", wait, {
            let lock = RwLock::new("stopped-rw").client(client.clone());
            Box::pin(async move { lock.read().wait(wait).acquire().await.map(drop) })
        }),
        ("a waiting write lock", wait, {
            let lock = RwLock::new("stopped-rw").client(client.clone());
            Box::pin(async move { lock.write().wait(wait).acquire().await.map(drop) })
        }),
        ("a waiting permit", wait, {
            let lock = Semaphore::new("stopped-sem", 2).client(client.clone());
            Box::pin(async move { lock.wait(wait).acquire().await.map(drop) })
        }),
    ];
    let mut took = Vec::new();
    for (what, wait, call) in calls {
        let started = Instant::now();
        let result = call.await;
        let elapsed = started.elapsed();
        took.push((what, elapsed));
        let error = result.expect_err(what);
        assert!(
            matches!(error, LockError::Redis { .. }) && !error.is_busy(),
            "{what}: {error:?}"
        );
        // One call deadline after the wait, and a second of slack for a
        // loaded machine: half of what a second attempt would add.
        assert!(
            elapsed < wait + deadline + Duration::from_secs(1),
            "{what} ended {elapsed:?} after it began, its wait {wait:?} and a call deadline \
             {deadline:?} (all: {took:?})"
        );
    }
    signal(&server, "-CONT");
    eprintln!("{took:?}");
}

/// A reply that comes after the lock's validity ended hands out no lock:
/// the server is stopped (SIGSTOP) while a try of a 300 ms lock is on its
/// way, and resumed 800 ms later; it then takes the key and answers, but
/// by then the lock the reply grants is valid no longer. The try returns
/// the Redis-kind error that says so (not a guard whose validity is over),
/// and the key is released in the background. Found by the simulation
/// (lock-sim node seed 15, design §17); before, the try returned `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_comes_after_the_locks_validity_hands_out_no_lock() {
    let server = RedisServer::start();
    let client = Client::new(
        Config::new(server.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    Lock::new("warm")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    signal(&server, "-STOP");
    let ttl = Duration::from_millis(300);
    let trying = tokio::spawn({
        let lock = Lock::new("late").ttl(ttl).client(client.clone());
        async move { lock.try_acquire().await }
    });
    // The fault: the server stays stopped well past the lock's ttl (the
    // request waits in its socket meanwhile).
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    signal(&server, "-CONT");
    let result = tokio::time::timeout(LINE_TIMEOUT, trying)
        .await
        .unwrap()
        .unwrap();
    let error = result
        .map(drop)
        .expect_err("a lock whose validity was over when its reply came is not handed out");
    assert!(
        matches!(error, LockError::Redis { .. }) && !error.is_busy(),
        "{error:?}"
    );
    assert!(error.to_string().contains("validity"), "{error}");
    wait_until_async("the late key is released or expired", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{late}"]) == ":0\r\n"
    })
    .await;
}
