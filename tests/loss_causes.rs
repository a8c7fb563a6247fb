//! Loss causes that are true (issue 25): a key found gone, or holding
//! another token, while the holder's validity still had time was deleted or
//! replaced, not expired; only once the validity ran out is it expired or
//! taken over. The same on renewals and releases, on one server and over a
//! quorum. A loss is logged once, at warn, inside the `lock.hold` span (seen
//! in a default `fmt` subscriber), the span records how the hold ended, the
//! metric is labelled by the true cause, and `renewal_stats()` counts each
//! cause the driver sees.

mod common;
use common::*;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::admin::LockKind;
use lock_runtime::{Client, Config, Lock, LockError, LostCause};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::fmt::MakeWriter;

/// Long enough that a loss found by the first renewal (a third of it in)
/// is found with most of the validity left, even on a loaded machine.
const TTL: Duration = Duration::from_secs(3);

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// What a `fmt` subscriber wrote.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The lines at warn level.
    fn warns(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(" WARN "))
            .map(str::to_owned)
            .collect()
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

impl<'a> MakeWriter<'a> for Output {
    type Writer = Output;

    fn make_writer(&'a self) -> Output {
        self.clone()
    }
}

/// A default `fmt` subscriber (INFO and up, no span events) writing to
/// `output`; `close`: with span close events, to read a span's last fields.
fn fmt_into(output: &Output, close: bool) -> tracing::subscriber::DefaultGuard {
    let builder = tracing_subscriber::fmt()
        .with_writer(output.clone())
        .with_ansi(false);
    let subscriber = if close {
        builder.with_span_events(FmtSpan::CLOSE).finish()
    } else {
        builder.finish()
    };
    tracing::subscriber::set_default(subscriber)
}

fn is_lost(result: &Result<(), LockError>, cause: LostCause) -> bool {
    matches!(result, Err(LockError::Lost { cause: seen, .. }) if *seen == cause)
}

/// The case: `lockctl release report:7 --force --yes` on a renewed
/// lock with most of its validity left. The holder is told its key was
/// deleted (not that it expired, nor to use `renew`), once, at warn, inside
/// the `lock.hold` span, which a default fmt subscriber shows.
#[tokio::test(flavor = "current_thread")]
async fn a_renewed_lock_force_released_while_valid_is_deleted_not_expired() {
    let output = Output::default();
    let _default = fmt_into(&output, false);
    let server = RedisServer::start();
    let client = client(&server);
    let operator = client.clone();
    let result = Lock::new("report:7")
        .ttl(TTL)
        .renew()
        .client(client.clone())
        .run(async {
            let forced = operator
                .force_release("report:7", LockKind::Exclusive)
                .await
                .unwrap();
            assert_eq!(forced.len(), 1, "{forced:?}");
            std::future::pending::<()>().await
        })
        .await;
    assert!(is_lost(&result, LostCause::Deleted), "{result:?}");
    let message = result.unwrap_err().to_string();
    assert!(message.contains("deleted"), "{message}");
    for misleading in ["expired", "use a longer ttl", "`renew`"] {
        assert!(!message.contains(misleading), "{misleading}: {message}");
    }
    let stats = client.renewal_stats();
    assert_eq!((stats.lost, stats.lost_in_redis), (1, 1), "{stats:?}");

    let losses: Vec<String> = output
        .warns()
        .into_iter()
        .filter(|line| line.contains("lock lost"))
        .collect();
    assert_eq!(losses.len(), 1, "one warn per loss:\n{}", output.text());
    let warn = &losses[0];
    for expected in [
        "lock.hold{",
        "report:7",
        "cause=\"deleted\"",
        "lock.outcome",
    ] {
        assert!(warn.contains(expected), "{expected}: {warn}");
    }
    assert!(
        !output.text().contains("expired"),
        "no line says expired:\n{}",
        output.text()
    );
}

/// Another holder's token put in the key while the holder's validity had
/// time: replaced, not taken over. For a renewed lock (found by a renewal)
/// and a plain one (found by its release).
/// `on_lost = "continue"` (`OnLost::Continue`): the loss is logged once, at
/// warn, in the `lock.hold` span, when the renewal sees it, while the body
/// still runs (it runs on, and returns its value), not when it ends.
#[tokio::test(flavor = "current_thread")]
async fn a_loss_under_continue_is_logged_when_seen_while_the_body_runs() {
    let output = Output::default();
    let _default = fmt_into(&output, false);
    let server = RedisServer::start();
    let client = client(&server);
    let operator = client.clone();
    let seen = output.clone();
    let result = Lock::new("rebalance:3")
        .ttl(TTL)
        .renew()
        .on_lost(lock_runtime::OnLost::Continue)
        .client(client.clone())
        .run(async move {
            operator
                .force_release("rebalance:3", LockKind::Exclusive)
                .await
                .unwrap();
            // The body goes on; the line comes with the renewal that finds
            // the key gone (a third of the ttl in), before the body ends.
            wait_until_async("the loss is logged", LINE_TIMEOUT, || {
                seen.warns().iter().any(|line| line.contains("lock lost"))
            })
            .await;
            "moved"
        })
        .await;
    assert_eq!(result.unwrap(), "moved");
    let losses: Vec<String> = output
        .warns()
        .into_iter()
        .filter(|line| line.contains("lock lost"))
        .collect();
    assert_eq!(losses.len(), 1, "one warn per loss:\n{}", output.text());
    for expected in ["lock.hold{", "rebalance:3", "cause=\"deleted\"", "runs on"] {
        assert!(losses[0].contains(expected), "{expected}: {}", losses[0]);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_key_replaced_while_valid_is_replaced_not_taken_over() {
    let output = Output::default();
    let _default = fmt_into(&output, false);
    let server = RedisServer::start();
    let client = client(&server);
    let renewed = Lock::new("replaced:renewed")
        .ttl(TTL)
        .renew()
        .client(client.clone())
        .run(async {
            redis(
                &server,
                &["SET", "lock:{replaced:renewed}", "another", "PX", "30000"],
            );
            std::future::pending::<()>().await
        })
        .await;
    assert!(is_lost(&renewed, LostCause::Replaced), "{renewed:?}");

    let plain = Lock::new("replaced:plain")
        .ttl(TTL)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    redis(
        &server,
        &["SET", "lock:{replaced:plain}", "another", "PX", "30000"],
    );
    let released = plain.release().await;
    assert!(is_lost(&released, LostCause::Replaced), "{released:?}");
    // The other holder's key is untouched.
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{replaced:plain}"])).as_deref(),
        Some("another")
    );
    let stats = client.renewal_stats();
    assert_eq!((stats.lost, stats.lost_in_redis), (1, 1), "{stats:?}");
    let losses = output.warns();
    assert_eq!(losses.len(), 2, "one warn per loss:\n{}", output.text());
    assert!(losses
        .iter()
        .all(|line| line.contains("cause=\"replaced\"")));
    // The release's loss is logged inside its `lock.release` span.
    assert!(losses.iter().any(|line| line.contains("lock.release{")));
}

/// Once the validity has run out, a key found gone expired and another
/// token means another holder took it after the ttl: the old causes, with
/// the advice that fits them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gone_after_the_validity_expired() {
    let server = RedisServer::start();
    let client = client(&server);
    let short = Duration::from_millis(100);
    let expired = Lock::new("expired")
        .ttl(short)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let taken = Lock::new("taken")
        .ttl(short)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    wait_until_async("both keys expired", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{expired}", "lock:{taken}"]) == ":0\r\n"
    })
    .await;
    let _other = Lock::new("taken")
        .ttl(TTL)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let released = expired.release().await;
    assert!(is_lost(&released, LostCause::Expired), "{released:?}");
    assert!(
        released.unwrap_err().to_string().contains("longer ttl"),
        "an expiry's advice"
    );
    let released = taken.release().await;
    assert!(is_lost(&released, LostCause::TakenOver), "{released:?}");
}

/// Over a quorum the backend only says what a majority found; the cause
/// is named the same way: deleted on every node while valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_quorum_a_lock_deleted_while_valid_is_deleted() {
    let nodes = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let client = quorum_client(&nodes);
    let renewed = Lock::new("quorum:renewed")
        .ttl(TTL)
        .renew()
        .client(client.clone())
        .run(async {
            for node in &nodes {
                redis(node, &["DEL", "lock:{quorum:renewed}"]);
            }
            std::future::pending::<()>().await
        })
        .await;
    assert!(is_lost(&renewed, LostCause::Deleted), "{renewed:?}");

    let plain = Lock::new("quorum:plain")
        .ttl(TTL)
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    for node in &nodes {
        redis(
            node,
            &["SET", "lock:{quorum:plain}", "another", "PX", "30000"],
        );
    }
    let released = plain.release().await;
    assert!(is_lost(&released, LostCause::Replaced), "{released:?}");
}

/// The `lock.hold` span records how the hold ended: `released` for a body
/// run to its end and released, `lost` with its cause otherwise.
#[tokio::test(flavor = "current_thread")]
async fn the_hold_span_records_how_the_hold_ended() {
    let output = Output::default();
    let _default = fmt_into(&output, true);
    let server = RedisServer::start();
    let client = client(&server);
    Lock::new("ended:released")
        .client(client.clone())
        .run(async {})
        .await
        .unwrap();
    let lost = Lock::new("ended:lost")
        .ttl(TTL)
        .renew()
        .client(client.clone())
        .run(async {
            redis(&server, &["DEL", "lock:{ended:lost}"]);
            std::future::pending::<()>().await
        })
        .await;
    assert!(is_lost(&lost, LostCause::Deleted), "{lost:?}");
    let text = output.text();
    let closed = |name: &str| {
        text.lines()
            .find(|line| {
                line.contains(&format!("lock.hold{{lock.name={name}")) && line.contains("close")
            })
            .unwrap_or_else(|| panic!("no close of {name}:\n{text}"))
            .to_owned()
    };
    let released = closed("ended:released");
    assert!(
        released.contains("lock.outcome=\"released\"")
            || released.contains("lock.outcome=released"),
        "{released}"
    );
    let lost = closed("ended:lost");
    assert!(lost.contains("lost") && lost.contains("deleted"), "{lost}");
}

/// `distributed_lock_lost_total` is labelled by the true cause (every other
/// cause's series is there, at zero, from the template's first use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loss_metric_is_labelled_by_the_true_cause() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = RedisServer::start();
    let client = client(&server);
    let lost = Lock::new("metric:deleted")
        .metric_label("metric:<cause>")
        .ttl(TTL)
        .renew()
        .client(client.clone())
        .run(async {
            redis(&server, &["DEL", "lock:{metric:deleted}"]);
            std::future::pending::<()>().await
        })
        .await;
    assert!(is_lost(&lost, LostCause::Deleted), "{lost:?}");
    let counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| key.key().name() == "distributed_lock_lost_total")
        .filter(|(key, _, _, _)| {
            key.key()
                .labels()
                .any(|label| label.value() == "metric:<cause>")
        })
        .map(|(key, _, _, value)| {
            let cause = key
                .key()
                .labels()
                .find(|label| label.key() == "cause")
                .map(|label| label.value().to_owned())
                .unwrap_or_default();
            let DebugValue::Counter(count) = value else {
                panic!("a counter")
            };
            (cause, count)
        })
        .collect();
    assert_eq!(counted.len(), 9, "every cause's series: {counted:?}");
    let counted: Vec<_> = counted
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .collect();
    assert_eq!(counted, [("deleted".to_owned(), 1)]);
}

/// `renewal_stats()` counts a lock whose validity ran out without a
/// confirmed renewal (Redis stopped) as lost, `not_renewed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_stats_count_a_lock_not_renewed() {
    let server = RedisServer::start();
    let client = Client::new(
        Config::new(server.url())
            .connect_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let guard = Lock::new("stats:not-renewed")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    signal(&server, "-STOP");
    let cause = tokio::time::timeout(LINE_TIMEOUT, guard.lost()).await;
    signal(&server, "-CONT");
    assert_eq!(cause.ok(), Some(LostCause::NotRenewed));
    wait_until_async("the driver counts the loss", LINE_TIMEOUT, || {
        client.renewal_stats().lost == 1
    })
    .await;
    let stats = client.renewal_stats();
    assert_eq!(
        (
            stats.not_renewed,
            stats.lost_in_redis,
            stats.refused,
            stats.max_hold_reached
        ),
        (1, 0, 0, 0),
        "{stats:?}"
    );
    let released = guard.release().await;
    assert!(is_lost(&released, LostCause::NotRenewed), "{released:?}");
}

/// ... and one whose renewals stopped at its `max_hold`, `max_hold_reached`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_stats_count_a_lock_at_its_max_hold() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = Lock::new("stats:max-hold")
        .ttl(Duration::from_millis(300))
        .renew()
        .max_hold(Duration::from_millis(300))
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let cause = tokio::time::timeout(LINE_TIMEOUT, guard.lost()).await;
    assert_eq!(cause.ok(), Some(LostCause::MaxHold));
    let stats = client.renewal_stats();
    assert_eq!(
        (stats.lost, stats.max_hold_reached, stats.not_renewed),
        (1, 1, 0),
        "{stats:?}"
    );
}
