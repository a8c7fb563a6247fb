//! The metrics (`metrics` feature), read back with a debugging recorder:
//! acquisitions by outcome, wait and hold times (released or lost), losses
//! by cause (counted once), in-process hand-offs, renewals and their round
//! trips, each described with its unit; the `lock` label is the lock's
//! template (the attribute's key as written, `Lock::metric_label`, else
//! `unlabelled`), so 10,000 ids make one series.

mod common;
use common::*;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use lock_runtime::{distributed_lock, Client, Config, Lock, LockError, RwLock, Semaphore};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every metric seen so far: a snapshot drains the recorder, so they are
/// added up here. Counters by value, histograms by number of samples.
/// One recorder for the process (the tests of this file share it; their
/// lock labels differ), installed before any lock is taken.
struct Totals {
    snapshotter: Snapshotter,
    seen: Vec<Seen>,
    /// Each metric's unit and description, as described.
    described: Vec<(String, Option<Unit>, String)>,
}

/// A metric's name, labels and amount in one snapshot.
type Seen = (String, Vec<(String, String)>, u64);

fn totals() -> MutexGuard<'static, Totals> {
    static TOTALS: OnceLock<Mutex<Totals>> = OnceLock::new();
    TOTALS
        .get_or_init(|| {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            recorder.install().unwrap();
            Mutex::new(Totals {
                snapshotter,
                seen: Vec::new(),
                described: Vec::new(),
            })
        })
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Totals {
    fn refresh(&mut self) {
        for (key, unit, description, value) in self.snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            if let Some(description) = description {
                if !self.described.iter().any(|(known, _, _)| *known == name) {
                    self.described
                        .push((name.clone(), unit, description.to_string()));
                }
            }
            let amount = match value {
                DebugValue::Counter(count) => count,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            let labels = key
                .key()
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            self.seen
                .push((key.key().name().to_owned(), labels, amount));
        }
    }

    /// The label sets of `name` whose `lock` label starts with `lock`.
    fn series(&mut self, name: &str, lock: &str) -> Vec<Vec<(String, String)>> {
        self.refresh();
        let mut series: Vec<Vec<(String, String)>> = self
            .seen
            .iter()
            .filter(|(seen, labels, _)| {
                seen == name
                    && labels
                        .iter()
                        .any(|(k, v)| k == "lock" && v.starts_with(lock))
            })
            .map(|(_, labels, _)| labels.clone())
            .collect();
        series.sort();
        series.dedup();
        series
    }

    /// The total of `name` over the series with these `labels`.
    fn total(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.refresh();
        self.seen
            .iter()
            .filter(|(seen, series, _)| {
                seen == name
                    && labels
                        .iter()
                        .all(|(key, value)| series.iter().any(|(k, v)| k == key && v == value))
            })
            .map(|(_, _, amount)| amount)
            .sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_locks_did() {
    drop(totals()); // installed before any lock
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();

    // Acquisitions by outcome, under the label `order:<id>` the manual
    // API gives.
    let order = |id: u64| {
        Lock::new(format!("order:{id}"))
            .metric_label("order:<id>")
            .client(client.clone())
    };
    let guard = order(1).try_acquire().await.unwrap();
    let busy = order(1).try_acquire().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })));
    let timed_out = order(1).wait(Duration::from_millis(30)).acquire().await;
    assert!(matches!(timed_out, Err(LockError::WaitTimeout { .. })));
    guard.release().await.unwrap();
    for (outcome, count) in [("acquired", 1), ("busy", 1), ("timed_out", 1)] {
        assert_eq!(
            totals().total(
                "lock_acquisitions_total",
                &[("lock", "order:<id>"), ("outcome", outcome)]
            ),
            count,
            "{outcome}"
        );
    }
    assert_eq!(
        totals().total("lock_wait_seconds", &[("lock", "order:<id>")]),
        2
    );
    assert_eq!(
        totals().total(
            "lock_hold_seconds",
            &[("lock", "order:<id>"), ("outcome", "released")]
        ),
        1
    );

    // A loss, counted once though the body and the release both see it:
    // the key is deleted under its holder, whose renewal (a second after it
    // was taken: long before the 3 s ttl could run out on a loaded
    // machine) finds it gone.
    let lost = Lock::new("job:lost")
        .metric_label("job:<name>")
        .ttl(Duration::from_secs(3))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    redis(&server, &["DEL", "lock:{job:lost}"]);
    let stopped = lost.run(std::future::pending::<()>()).await;
    assert!(matches!(stopped, Err(LockError::Lost { .. })));
    assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));
    assert_eq!(
        totals().total(
            "lock_lost_total",
            &[("lock", "job:<name>"), ("cause", "deleted")]
        ),
        1
    );
    // The lost hold's time, under outcome `lost`.
    assert_eq!(
        totals().total(
            "lock_hold_seconds",
            &[("lock", "job:<name>"), ("outcome", "lost")]
        ),
        1
    );
    assert_eq!(
        totals().total(
            "lock_hold_seconds",
            &[("lock", "job:<name>"), ("outcome", "released")]
        ),
        0
    );
    assert!(totals().total("lock_renewals_total", &[]) >= 1);
    assert!(totals().total("lock_renewal_round_trips_total", &[]) >= 1);

    // In-process hand-offs: tasks of one client waiting for one key.
    let first = cohort_holder(&server, &client, "batch:x", Duration::from_secs(10)).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let lock = Lock::new("batch:x")
                .metric_label("batch:<x>")
                .wait(Duration::from_secs(10))
                .client(client.clone());
            tokio::spawn(async move { lock.acquire().await.unwrap().release().await.unwrap() })
        })
        .collect();
    wait_until_async("the waiters queue in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("batch:x") == 3
    })
    .await;
    first.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert!(totals().total("lock_handoffs_total", &[("lock", "batch:<x>")]) >= 1);
}

#[distributed_lock(key = "invoice:<id>", ttl = "10s", client = client)]
async fn bill(id: u64, client: &Client) -> Result<u64, LockError> {
    Ok(id)
}

/// The `lock` label is the template: 10,000 distinct ids make one series
/// per metric and outcome, through the attribute and the manual API of
/// every kind; a lock given no label is `unlabelled`, never its name. Every
/// metric is described, with its unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_ids_make_one_series() {
    drop(totals());
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    const IDS: u64 = 10_000;
    for id in 0..IDS {
        assert_eq!(bill(id, &client).await.unwrap(), id);
    }
    for id in 0..100u64 {
        Lock::new(format!("loose-{id}"))
            .client(client.clone())
            .run(async {})
            .await
            .unwrap();
        RwLock::new(format!("shelf:{id}"))
            .metric_label("shelf:<id>")
            .client(client.clone())
            .read()
            .run(async {})
            .await
            .unwrap();
        Semaphore::new(format!("pool:{id}"), 2)
            .metric_label("pool:<id>")
            .client(client.clone())
            .run(async {})
            .await
            .unwrap();
    }
    let mut totals = totals();
    let one = |lock: &str, outcome: &str| {
        vec![vec![
            ("lock".to_owned(), lock.to_owned()),
            ("outcome".to_owned(), outcome.to_owned()),
        ]]
    };
    assert_eq!(
        totals.series("lock_acquisitions_total", "invoice"),
        one("invoice:<id>", "acquired")
    );
    assert_eq!(
        totals.series("lock_hold_seconds", "invoice"),
        one("invoice:<id>", "released")
    );
    assert_eq!(
        totals.series("lock_wait_seconds", "invoice"),
        vec![vec![("lock".to_owned(), "invoice:<id>".to_owned())]]
    );
    assert_eq!(
        totals.total(
            "lock_acquisitions_total",
            &[("lock", "invoice:<id>"), ("outcome", "acquired")]
        ),
        IDS
    );
    for (label, prefix) in [
        ("unlabelled", "unlabelled"),
        ("shelf:<id>", "shelf"),
        ("pool:<id>", "pool"),
    ] {
        assert_eq!(
            totals.series("lock_acquisitions_total", prefix),
            one(label, "acquired"),
            "{label}"
        );
        // (The other test's helpers take unlabelled locks too.)
        let held = totals.total(
            "lock_hold_seconds",
            &[("lock", label), ("outcome", "released")],
        );
        assert!(
            held == 100 || (label == "unlabelled" && held > 100),
            "{label}: {held}"
        );
    }
    assert!(totals.series("lock_acquisitions_total", "loose").is_empty());
    // Described once, with units.
    for (name, unit) in [
        ("lock_acquisitions_total", Unit::Count),
        ("lock_wait_seconds", Unit::Seconds),
        ("lock_hold_seconds", Unit::Seconds),
    ] {
        let described = totals
            .described
            .iter()
            .find(|(known, _, _)| known == name)
            .unwrap_or_else(|| panic!("{name} is not described"));
        assert_eq!(described.1, Some(unit), "{name}");
        assert!(!described.2.is_empty(), "{name}");
    }
}
