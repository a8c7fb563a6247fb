//! Acknowledged mode says what is going on (issue 38): with a primary and
//! one replica behind Redis Sentinel, once the primary has fewer connected
//! replicas than each write must be confirmed by (the replica killed; or
//! the primary killed and the replica promoted, which has none), every
//! acquisition is refused with an error that names the cause and the fix,
//! a warning says so once (not once per refusal), and the gauge
//! `distributed_lock_acknowledged_replicas` shows the number. Its own test binary: the
//! capturing subscriber is the thread's default (each test runs on a
//! current-thread runtime, so every task of the client runs under it), and
//! the metrics recorder is the process's.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use test_support::RedisSentinel;

/// Warnings seen by a subscriber.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() <= tracing::Level::WARN {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {:?}", event.metadata().level(), event));
        }
    }
}

impl Warnings {
    /// The warnings that the primary has too few replicas.
    fn shortages(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|warning| warning.contains("acknowledged mode: the Redis primary has"))
            .cloned()
            .collect()
    }
}

/// The process's metrics recorder.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    })
}

/// The value of the gauge `distributed_lock_acknowledged_replicas`, if set.
fn replicas_gauge() -> Option<f64> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(gauge)
                if key.key().name() == "distributed_lock_acknowledged_replicas" =>
            {
                Some(gauge.into_inner())
            }
            _ => None,
        })
}

/// A client through the sentinels of `setup`, each acquisition confirmed
/// by one replica within 100 ms (as the guide's Sentinel example).
fn acknowledged(setup: &RedisSentinel) -> Client {
    Client::new(
        Config::new(setup.url(""))
            .response_timeout(Duration::from_secs(3))
            .acknowledged(1, Duration::from_millis(100)),
    )
    .unwrap()
}

/// Tries `name` until it is refused for want of replicas (a failover in
/// progress fails calls otherwise meanwhile), within 60 s; returns the
/// refusal.
async fn refused(client: &Client, name: &str) -> LockError {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Lock::new(name).client(client.clone()).try_acquire().await {
            Err(error @ LockError::NotReplicated { .. }) => return error,
            Ok(guard) => {
                guard.release().await.unwrap();
            }
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "never refused for want of replicas"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The refusal names the cause and the fix; three more refusals add no
/// warning; the gauge shows 0.
async fn refusals_say_why(client: &Client, warnings: &Warnings, after: &str) {
    let error = refused(client, "report").await;
    println!("{after}: {error}");
    assert!(
        matches!(
            error,
            LockError::NotReplicated {
                confirmed: Some(0),
                wanted: 1,
                connected: Some(0),
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("The primary has 0 connected replicas, fewer than the 1")
            && message.contains("n + 1 replicas"),
        "{message}"
    );
    for _ in 0..3 {
        refused(client, "report").await;
    }
    let shortages = warnings.shortages();
    assert_eq!(shortages.len(), 1, "{shortages:#?}");
    assert!(shortages[0].contains("connected: 0"), "{}", shortages[0]);
    assert_eq!(replicas_gauge(), Some(0.0));
}

/// The only replica killed: the primary has none.
#[tokio::test]
async fn with_its_replica_killed_the_primary_refuses_and_says_why_once() {
    use tracing_subscriber::layer::SubscriberExt;
    snapshotter();
    let warnings = Warnings::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let mut setup = RedisSentinel::try_start(1, 3).unwrap();
    let primary = setup.primary().unwrap();
    let client = acknowledged(&setup);
    Lock::new("report")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let replica = setup.replicas_of(primary)[0];
    setup.kill_node(replica);
    refusals_say_why(&client, &warnings, "the replica killed").await;
}

/// The primary killed: the sentinels promote the replica, which has no
/// replica of its own (the outage: 212 refusals in a row, nothing
/// logged).
#[tokio::test]
async fn after_a_failover_to_a_lone_replica_refusals_say_why_once() {
    use tracing_subscriber::layer::SubscriberExt;
    snapshotter();
    let warnings = Warnings::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let mut setup = RedisSentinel::try_start(1, 3).unwrap();
    let primary = setup.primary().unwrap();
    let client = acknowledged(&setup);
    Lock::new("report")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    setup.kill_node(primary);
    setup.wait_for_new_primary(primary, 0).unwrap();
    refusals_say_why(
        &client,
        &warnings,
        "the primary killed, its replica promoted",
    )
    .await;
}
