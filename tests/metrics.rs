//! The metrics (`metrics` feature), read back with a debugging recorder:
//! acquisitions by outcome, wait and hold times, losses by cause (counted
//! once), in-process hand-offs, renewals and their round trips; the `lock`
//! label is the name's text before its first `:`.

mod common;
use common::*;
use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every metric seen so far: a snapshot drains the recorder, so they are
/// added up here. Counters by value, histograms by number of samples.
struct Totals {
    snapshotter: Snapshotter,
    seen: Vec<Seen>,
}

/// A metric's name, labels and amount in one snapshot.
type Seen = (String, Vec<(String, String)>, u64);

impl Totals {
    fn refresh(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
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
    let recorder = DebuggingRecorder::new();
    let mut totals = Totals {
        snapshotter: recorder.snapshotter(),
        seen: Vec::new(),
    };
    recorder.install().unwrap();
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();

    // Acquisitions by outcome, under the label `order` for `order:<id>`.
    let guard = Lock::new("order:1")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let busy = Lock::new("order:1")
        .client(client.clone())
        .try_acquire()
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })));
    let timed_out = Lock::new("order:1")
        .wait(Duration::from_millis(30))
        .client(client.clone())
        .acquire()
        .await;
    assert!(matches!(timed_out, Err(LockError::WaitTimeout { .. })));
    guard.release().await.unwrap();
    for (outcome, count) in [("acquired", 1), ("busy", 1), ("timed_out", 1)] {
        assert_eq!(
            totals.total(
                "lock_acquisitions_total",
                &[("lock", "order"), ("outcome", outcome)]
            ),
            count,
            "{outcome}"
        );
    }
    assert_eq!(totals.total("lock_wait_seconds", &[("lock", "order")]), 2);
    assert_eq!(totals.total("lock_hold_seconds", &[("lock", "order")]), 1);

    // A loss, counted once though the body and the release both see it:
    // the key is deleted under its holder, whose renewal (a second after it
    // was taken: long before the 3 s ttl could run out on a loaded
    // machine) finds it gone.
    let lost = Lock::new("job:lost")
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
        totals.total("lock_lost_total", &[("lock", "job"), ("cause", "deleted")]),
        1
    );
    assert!(totals.total("lock_renewals_total", &[]) >= 1);
    assert!(totals.total("lock_renewal_round_trips_total", &[]) >= 1);

    // In-process hand-offs: tasks of one client waiting for one key.
    let first = cohort_holder(&server, &client, "batch:x", Duration::from_secs(10)).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let lock = Lock::new("batch:x")
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
    assert!(totals.total("lock_handoffs_total", &[("lock", "batch")]) >= 1);
}
