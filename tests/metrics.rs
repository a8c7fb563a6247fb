//! The metrics (`metrics` feature) as a Prometheus server scrapes them:
//! read from the text metrics-exporter-prometheus renders, with its unit
//! suffixes on (`with_recommended_naming(true)`) and histogram buckets, as
//! the observability guide installs it. Acquisitions by outcome, wait and
//! hold times, losses by cause, renewals and their failures, hand-offs and
//! the held-locks gauge, each once under its name (no doubled unit), every
//! counter of a template at zero from its first use, the `lock` label the
//! template (the attribute's key, `metric_label`, else `caller`), sets
//! counted per lock, 10,000 ids in one series.

mod common;
use common::*;
use std::sync::OnceLock;
use std::time::Duration;

use lock_runtime::{distributed_lock, Client, Config, Lock, LockError, RwLock, Semaphore};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The exporter, installed once for the process (the tests of this file
/// share it; their templates differ), before any lock is taken.
fn exporter() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .with_recommended_naming(true)
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".into()),
                &[0.001, 0.01, 0.1, 1.0, 10.0],
            )
            .unwrap()
            .install_recorder()
            .unwrap()
    })
}

/// The value of the sample `name{labels}` in the rendered text, its labels
/// exactly these (in any order; `le` for a bucket included); `None` when
/// there is no such sample.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    wanted.sort();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (seen, labels) = match series.split_once('{') {
                Some((seen, rest)) => (seen, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if seen != name {
                return None;
            }
            // `k="v"` pairs, comma-separated; a value may hold a comma.
            let mut have: Vec<String> = Vec::new();
            let mut rest = labels;
            while let Some((key, after)) = rest.split_once("=\"") {
                let (value, after) = after.split_once('"')?;
                have.push(format!("{}=\"{value}\"", key.trim_start_matches(',')));
                rest = after;
            }
            have.sort();
            (have == wanted).then(|| value.parse().unwrap())
        })
}

fn render() -> String {
    exporter().render()
}

/// The metric names in the text: every `# TYPE` line's.
fn names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .collect()
}

const A: &str = "distributed_lock_acquisitions_total";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_locks_did() {
    exporter();
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();

    // Acquisitions by outcome, under the label `order:<id>` the manual
    // API gives; every outcome's series is there from the first use.
    let order = |id: u64| {
        Lock::new(format!("order:{id}"))
            .metric_label("order:<id>")
            .client(client.clone())
    };
    let guard = order(1).try_acquire().await.unwrap();
    let text = render();
    for outcome in ["busy", "timed_out", "error"] {
        let labels = [("lock", "order:<id>"), ("outcome", outcome)];
        assert_eq!(sample(&text, A, &labels), Some(0.0), "{outcome}\n{text}");
    }
    for cause in ["expired", "deleted", "not_renewed", "taken_over"] {
        let labels = [("lock", "order:<id>"), ("cause", cause)];
        assert_eq!(
            sample(&text, "distributed_lock_lost_total", &labels),
            Some(0.0),
            "{cause}\n{text}"
        );
    }
    let held =
        |text: &str, lock: &str| sample(text, "distributed_lock_held_locks", &[("lock", lock)]);
    assert_eq!(held(&text, "order:<id>"), Some(1.0), "{text}");
    let busy = order(1).try_acquire().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })));
    let timed_out = order(1).wait(Duration::from_millis(30)).acquire().await;
    assert!(matches!(timed_out, Err(LockError::WaitTimeout { .. })));
    guard.release().await.unwrap();
    let text = render();
    for (outcome, count) in [("acquired", 1.0), ("busy", 1.0), ("timed_out", 1.0)] {
        let labels = [("lock", "order:<id>"), ("outcome", outcome)];
        assert_eq!(sample(&text, A, &labels), Some(count), "{outcome}");
    }
    let wait = [("lock", "order:<id>")];
    assert_eq!(
        sample(&text, "distributed_lock_wait_seconds_count", &wait),
        Some(2.0)
    );
    let hold = [("lock", "order:<id>"), ("outcome", "released")];
    assert_eq!(
        sample(&text, "distributed_lock_hold_seconds_count", &hold),
        Some(1.0)
    );
    assert_eq!(held(&text, "order:<id>"), Some(0.0));

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
    let text = render();
    // Once, under one cause (`deleted`, unless a loaded machine let the
    // validity run out first: which cause is `tests/loss_causes.rs`'s).
    let counted: f64 = [
        "expired",
        "taken_over",
        "deleted",
        "replaced",
        "not_renewed",
        "max_hold",
        "permission_denied",
        "refused",
        "released",
    ]
    .iter()
    .map(|cause| {
        let labels = [("lock", "job:<name>"), ("cause", *cause)];
        sample(&text, "distributed_lock_lost_total", &labels).expect("every cause's series")
    })
    .sum();
    assert_eq!(counted, 1.0, "{text}");
    let lost_hold = [("lock", "job:<name>"), ("outcome", "lost")];
    assert_eq!(
        sample(&text, "distributed_lock_hold_seconds_count", &lost_hold),
        Some(1.0)
    );
    let released = [("lock", "job:<name>"), ("outcome", "released")];
    assert_eq!(
        sample(&text, "distributed_lock_hold_seconds_count", &released),
        None
    );
    assert_eq!(held(&text, "job:<name>"), Some(0.0));
    assert!(sample(&text, "distributed_lock_renewals_total", &[]).unwrap() >= 1.0);
    assert!(sample(&text, "distributed_lock_renewal_round_trips_total", &[]).unwrap() >= 1.0);

    // Renewal failures: Redis stopped under a renewed lock (renewed every
    // 2 s; a call fails after 200 ms).
    let impatient = Client::new(
        Config::new(server.url())
            .response_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let renewed = Lock::new("job:paused")
        .metric_label("job:<paused>")
        .ttl(Duration::from_secs(6))
        .renew()
        .client(impatient)
        .try_acquire()
        .await
        .unwrap();
    let failures = |text: &str| {
        sample(
            text,
            "distributed_lock_renewal_failures_total",
            &[("lock", "job:<paused>")],
        )
    };
    assert_eq!(failures(&render()), Some(0.0));
    signal(&server, "-STOP");
    wait_until_async("a renewal fails", Duration::from_secs(60), || {
        failures(&render()).unwrap_or(0.0) >= 1.0
    })
    .await;
    signal(&server, "-CONT");
    let _ = renewed.release().await; // held or lost by now: either is fine here

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
    let handoffs = [("lock", "batch:<x>")];
    assert!(sample(&render(), "distributed_lock_handoffs_total", &handoffs).unwrap() >= 1.0);
}

#[distributed_lock(key = "invoice:<id>", ttl = "10s", client = client)]
async fn bill(id: u64, client: &Client) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = ["acct:<from>", "acct:<to>"], ttl = "10s", client = client)]
async fn transfer(from: u64, to: u64, client: &Client) -> Result<(), LockError> {
    let _ = (from, to);
    Ok(())
}

/// The `lock` label is the template: 10,000 distinct ids make one series
/// per metric and outcome, through the attribute and the manual API of
/// every kind; a manual lock given no label is its `caller`, else
/// `unlabelled`, never its name. A set of 2 keys counts 2 acquisitions and
/// 2 holds. Every name appears once, unit included once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_ids_make_one_series() {
    exporter();
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
        Lock::new(format!("named-{id}"))
            .caller("billing::close")
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
    for id in 0..50u64 {
        transfer(id, id + 1, &client).await.unwrap();
    }
    let text = render();
    let series = |name: &str, lock: &str| -> usize {
        text.lines()
            .filter(|line| line.starts_with(&format!("{name}{{")))
            .filter(|line| line.contains(&format!("lock=\"{lock}")))
            .count()
    };
    // One series per outcome (4), whatever the ids.
    assert_eq!(series(A, "invoice"), 4, "{text}");
    let acquired = |lock: &str| sample(&text, A, &[("lock", lock), ("outcome", "acquired")]);
    assert_eq!(acquired("invoice:<id>"), Some(IDS as f64));
    for label in ["unlabelled", "billing::close", "shelf:<id>", "pool:<id>"] {
        assert!(acquired(label).unwrap() >= 100.0, "{label}");
        let released = [("lock", label), ("outcome", "released")];
        let holds = sample(&text, "distributed_lock_hold_seconds_count", &released).unwrap();
        assert!(holds >= 100.0, "{label}: {holds}");
    }
    assert_eq!(series(A, "loose"), 0);
    assert_eq!(series(A, "named"), 0);
    // A set of two keys: 2 acquisitions and 2 holds a call.
    let set = "acct:<from>, acct:<to>";
    assert_eq!(acquired(set), Some(100.0), "{text}");
    let released = [("lock", set), ("outcome", "released")];
    assert_eq!(
        sample(&text, "distributed_lock_hold_seconds_count", &released),
        Some(100.0)
    );
    assert_eq!(
        sample(
            &text,
            "distributed_lock_wait_seconds_count",
            &[("lock", set)]
        ),
        Some(100.0)
    );
    // Each name once, its unit once (the exporter adds `_seconds` only
    // where it is missing), every one under the library's prefix.
    let names = names(&text);
    for name in [
        A,
        "distributed_lock_wait_seconds",
        "distributed_lock_hold_seconds",
        "distributed_lock_lost_total",
        "distributed_lock_handoffs_total",
        "distributed_lock_renewal_failures_total",
        "distributed_lock_held_locks",
    ] {
        assert_eq!(
            names.iter().filter(|seen| **seen == name).count(),
            1,
            "{name}\n{text}"
        );
    }
    assert!(!text.contains("seconds_seconds"), "{text}");
    assert!(
        names
            .iter()
            .all(|name| name.starts_with("distributed_lock_")),
        "{names:?}"
    );
    assert!(text.contains("# HELP distributed_lock_hold_seconds Time from acquisition"));
    assert!(text.contains("distributed_lock_hold_seconds_bucket{"));
}
