//! What users read when something goes wrong, on real servers: a
//! connection error names the server (password masked); a master name no
//! sentinel monitors is said to be one (not a failover that passes); a URL
//! scheme the library does not take is named with those it takes; a busy
//! scheduled job's lock kept by `hold_at_least` says so (no advice to
//! wait); durations read as people write them; and an acquisition the caller
//! was told had failed is never logged as "released".

mod common;
use common::*;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{distributed_lock, Client, Config, Lock, LockError};
use test_support::{Proxy, RedisSentinel, RefusedPort};

/// Whether `text` prints a duration with more than 3 decimals
/// (`32.617313ms`, `2.000123456s`).
fn has_long_decimals(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.windows(6).any(|w| {
        w[0].is_ascii_digit() && w[1] == b'.' && w[2..6].iter().all(|b| b.is_ascii_digit())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_error_names_the_server_with_its_password_masked() {
    let refused = RefusedPort::new().unwrap();
    let config = Config::new(format!("redis://app:s3cret@127.0.0.1:{}/2", refused.port()))
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200));
    let client = Client::new(config).unwrap();
    let error = Lock::new("job")
        .client(client)
        .try_acquire()
        .await
        .unwrap_err();
    let message = error.to_string();
    let url = format!("redis://app:***@127.0.0.1:{}/2", refused.port());
    assert!(message.contains(&url), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
    assert!(!format!("{error:?}").contains("s3cret"), "{error:?}");
    match &error {
        LockError::Redis { server, .. } => assert_eq!(server, &url),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheme_the_library_does_not_take_is_named_with_those_it_takes() {
    let error = Client::new(Config::new("redis+sentinel://127.0.0.1:26379/mymaster"))
        .unwrap_err()
        .to_string();
    for expected in [
        "`redis+sentinel`",
        "redis-sentinel://",
        "redis+unix",
        "rediss-cluster",
    ] {
        assert!(error.contains(expected), "{expected}: {error}");
    }
    assert!(!error.contains("(InvalidClientConfig)"), "{error}");
}

/// A master name no sentinel monitors (a typo) is said to be one, at
/// once, not retried for the call's deadline, with no word of a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_sentinel_master_name_says_so() {
    let sentinel = RedisSentinel::try_start(0, 1).expect("a Sentinel setup");
    let url = sentinel
        .url("")
        .replace(&format!("/{}", sentinel.master_name()), "/mymastr");
    let client = Client::new(Config::new(url).response_timeout(Duration::from_secs(3))).unwrap();
    let started = Instant::now();
    let error = Lock::new("job")
        .client(client)
        .try_acquire()
        .await
        .unwrap_err();
    let message = error.to_string();
    for expected in ["no sentinel monitors", "`mymastr`", "check the name"] {
        assert!(message.contains(expected), "{expected}: {message}");
    }
    assert!(!message.contains("passes by itself"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "retried as if it could pass: {:?}",
        started.elapsed()
    );
}

#[distributed_lock(key = "report:<day>", ttl = "1m", hold_at_least = "30s", client = client)]
async fn report(day: u32, client: &Client) -> Result<u32, LockError> {
    Ok(day)
}

/// A scheduled job's lock, kept after its run: the next instance is told
/// the lock is kept (and for how long), not to `wait` for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_on_a_kept_lock_says_it_is_kept_not_to_wait() {
    let server = RedisServer::start();
    let (one, other) = (
        Client::new(Config::new(server.url())).unwrap(),
        Client::new(Config::new(server.url())).unwrap(),
    );
    assert_eq!(report(7, &one).await.unwrap(), 7);
    let error = report(7, &other).await.unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    let LockError::Kept { remaining, .. } = &error else {
        panic!("{error:?}")
    };
    assert!(*remaining > Duration::from_secs(20), "{remaining:?}");
    let message = error.to_string();
    assert!(
        message.contains("kept for") && message.contains("hold_at_least"),
        "{message}"
    );
    assert!(!message.contains("wait"), "{message}");
    assert!(!has_long_decimals(&message), "{message}");

    // Held (not kept): `Busy`, which may advise waiting.
    let held = Lock::new("report:8")
        .hold_at_least(Duration::from_secs(30))
        .client(one)
        .acquire()
        .await
        .unwrap();
    let busy = report(8, &other).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy:?}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_in_messages_read_as_people_write_them() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let held = Lock::new("k")
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let timed_out = Lock::new("k")
        .client(client.clone())
        .wait(Duration::from_millis(30))
        .acquire()
        .await
        .unwrap_err()
        .to_string();
    // `42ms`, or on a loaded machine `1.25s`: never `32.617313ms`.
    let shown = timed_out
        .split("wait of ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    let number = shown.trim_end_matches("ms").trim_end_matches('s');
    let (whole, decimals) = number.split_once('.').unwrap_or((number, ""));
    assert!(
        (shown.ends_with("ms") && decimals.is_empty() || shown.ends_with('s'))
            && !whole.is_empty()
            && whole.chars().all(|c| c.is_ascii_digit())
            && decimals.len() <= 3
            && decimals.chars().all(|c| c.is_ascii_digit()),
        "{timed_out}"
    );
    assert!(!has_long_decimals(&timed_out), "{timed_out}");
    held.release().await.unwrap();
    let too_long = Lock::new("k")
        .client(client)
        .ttl(Duration::from_secs(400 * 24 * 3600))
        .acquire()
        .await
        .unwrap_err()
        .to_string();
    assert!(too_long.contains("a ttl of 9600h;"), "{too_long}");
}

/// What a `fmt` subscriber wrote.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Output {
    type Writer = Output;

    fn make_writer(&'a self) -> Output {
        self.clone()
    }
}

/// An acquisition whose answer never came fails for its caller; its
/// possible lock is cleared in the background, after failed attempts. No
/// line says "released": the caller never held it.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_acquisition_is_not_logged_as_released() {
    let output = Output::default();
    let _default = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(output.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish(),
    );
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::new(
        Config::new(proxy.url())
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    Lock::new("warm")
        .client(client.clone())
        .run(async {})
        .await
        .unwrap();

    proxy.stall();
    let error = Lock::new("job")
        .ttl(Duration::from_secs(20))
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
    // The stalled SET never reaches Redis; the clean-up's first attempts
    // are refused, then one goes through.
    proxy.refuse(true);
    proxy.drop_all();
    proxy.resume();
    wait_until_async("a clean-up attempt fails", LINE_TIMEOUT, || {
        output
            .text()
            .contains("background release failed; tried again")
    })
    .await;
    proxy.refuse(false);
    wait_until_async("the clean-up is done", LINE_TIMEOUT, || {
        let text = output.text();
        text.contains("cleared after failed attempts")
            || text.contains("released after failed attempts")
    })
    .await;
    let text = output.text();
    assert!(!text.contains("released after failed attempts"), "{text}");
    assert_eq!(redis(&server, &["EXISTS", "lock:{job}"]), ":0\r\n");
}
