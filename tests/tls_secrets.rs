//! Over TLS, a password in the URL and the TLS client key never appear in
//! `Debug` or `Display` output, in errors, or in logs at any level (every
//! `tracing` event and span field down to TRACE, every `log` record, the
//! `redis` crate's included), whether things go right or wrong.
//! Its own test binary: the capturing subscriber is this thread's default,
//! the `log` logger the process's, and no other test may race them.

mod common;
use common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{distributed_lock, Client, Config, Lock, LockError};
use test_support::{AuthClients, Ca, TlsOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const PASSWORD: &str = "hunter2-tls-secret";

/// Every line logged, by `tracing` (events, and span fields as recorded)
/// or by `log`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<String>>>);

impl Captured {
    fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl<S: Subscriber> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut text = Text(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut text);
        self.push(text.0);
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut text = Text("record".to_owned());
        values.record(&mut text);
        self.push(text.0);
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut text = Text(format!(
            "{} {}",
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut text);
        self.push(text.0);
    }
}

impl log::Log for Captured {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.push(format!(
            "log {} {} {}",
            record.level(),
            record.target(),
            record.args()
        ));
    }

    fn flush(&self) {}
}

/// The client of the attribute below.
struct App {
    locks: Client,
}

/// Returns nothing: a lock it cannot take is logged (at error level).
#[distributed_lock(key = "secret-attribute", ttl = "5s", client = app.locks)]
async fn guarded(app: &App) {}

/// Every way a secret could get out, with a TLS server that wants a
/// password and a client certificate: a lock taken, renewed, waited for
/// and released; a wrong password; a server of an unknown CA; a server
/// that dies under a renewed lock; a quorum missing a node; configuration
/// mistakes. (A current-thread runtime: every task of the clients runs on
/// this thread, under this test's subscriber.)
#[tokio::test(flavor = "current_thread")]
async fn secrets_never_appear_over_tls() {
    let captured = Captured::default();
    log::set_logger(Box::leak(Box::new(captured.clone()))).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    // The capture sees the lowest level of both (checked below).
    tracing::trace!("probe");
    log::trace!("probe");

    let (ca, unknown) = (Ca::new("lock-tests CA"), Ca::new("somebody else's CA"));
    let me = ca.client_certificate("app");
    let secrets: Vec<String> = std::iter::once(PASSWORD.to_owned())
        .chain(
            me.key_pem
                .lines()
                .filter(|line| !line.starts_with("-----"))
                .map(str::to_owned),
        )
        .collect();
    let mut shown: Vec<String> = Vec::new();
    let options = TlsOptions::loopback(&ca).auth_clients(AuthClients::Yes);
    // The user `app` needs the password (test-support's own connections
    // stay the default user's).
    let start = |options: &TlsOptions| {
        let server = RedisServer::start_tls(options);
        let password = format!(">{PASSWORD}");
        let rule = [
            "ACL", "SETUSER", "app", "on", &password, "~*", "&*", "+@all",
        ];
        assert_eq!(redis(&server, &rule), "+OK\r\n");
        server
    };
    // Generous timeouts for a loaded machine (each TLS connection checks a
    // client certificate): the failures below are refusals, which are
    // immediate.
    let config = |url: String| {
        Config::new(url)
            .tls_root_certificates(ca.certificate_pem())
            .tls_client_certificate(me.certificate_pem.clone(), me.key_pem.clone())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
    };
    let with_password = |server: &RedisServer, password: &str| {
        format!("rediss://app:{password}@127.0.0.1:{}/", server.port())
    };

    // Things go right: acquired, renewed, waited for, released.
    let mut server = start(&options);
    let good = config(with_password(&server, PASSWORD));
    let client = Client::new(good.clone()).unwrap();
    let other = Client::new(good.clone()).unwrap();
    shown.extend([
        format!("{good:?}"),
        good.redacted_url(),
        format!("{client:?}"),
    ]);
    let guard = Lock::new("secret")
        .ttl(Duration::from_secs(3))
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let taken = std::time::Instant::now();
    let waiter = spawn_waiter(&other, "secret", Duration::from_secs(20));
    wait_until_async("the waiter queued", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{secret}:queue"]) == ":1\r\n"
    })
    .await;
    // Renewed: a renewal sent after it was taken is confirmed (its validity
    // reaches past `taken + ttl`, less the 1 % + 2 ms drift margin).
    wait_until_async("the lock is renewed", LINE_TIMEOUT, || {
        assert!(guard.is_held(), "lost: {:?}", guard.lost_cause());
        let margin = guard.ttl() / 100 + Duration::from_millis(2);
        std::time::Instant::now() + guard.remaining() >= taken + guard.ttl() - margin
    })
    .await;
    guard.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();

    // A wrong password.
    let wrong = Client::new(config(with_password(&server, "not-the-password"))).unwrap();
    let error = Lock::new("secret")
        .client(wrong)
        .try_acquire()
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
    shown.extend([format!("{error}"), format!("{error:?}")]);

    // A server whose certificate an unknown CA signed, through the attribute
    // (which logs what it cannot return).
    let stranger = start(&TlsOptions::loopback(&unknown));
    let app = App {
        locks: Client::new(config(with_password(&stranger, PASSWORD))).unwrap(),
    };
    guarded(&app).await;
    let error = Lock::new("secret")
        .client(app.locks)
        .try_acquire()
        .await
        .unwrap_err();
    shown.extend([format!("{error}"), format!("{error:?}")]);

    // The server dies under a renewed lock: renewals fail (logged), the
    // release fails. Each fails at its call's deadline (a refused
    // reconnection is tried again until then): a client of short timeouts,
    // whose acquisition is tried again if its new connection (a TLS
    // handshake) misses them on a loaded machine.
    drop(client);
    let dying = Client::new(
        config(with_password(&server, PASSWORD))
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let lock = Lock::new("secret")
        .ttl(Duration::from_secs(3))
        .renew()
        .client(dying);
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    let guard = loop {
        match lock.try_acquire().await {
            Ok(guard) => break guard,
            Err(error) => {
                assert!(std::time::Instant::now() < deadline, "{error:?}");
                shown.extend([format!("{error}"), format!("{error:?}")]);
            }
        }
    };
    server.kill();
    wait_until_async("a failed renewal is logged", LINE_TIMEOUT, || {
        captured
            .lines()
            .iter()
            .any(|line| line.contains("renewal failed"))
    })
    .await;
    let error = guard.release().await.unwrap_err();
    shown.extend([format!("{error}"), format!("{error:?}")]);

    // A quorum with a password, one node down: its failures are logged.
    let mut nodes: Vec<RedisServer> = (0..3).map(|_| start(&options)).collect();
    nodes[2].kill();
    let hosts: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    let quorum = config(format!(
        "rediss-quorum://app:{PASSWORD}@{}",
        hosts.join(",")
    ));
    shown.extend([format!("{quorum:?}"), quorum.redacted_url()]);
    let quorum = Client::new(quorum).unwrap();
    open_connections(&quorum, &nodes[..2]).await;
    let lock = Lock::new("secret-quorum").client(quorum);
    lock.try_acquire().await.unwrap().release().await.unwrap();
    // Logged, by the release's background task if not before it returned
    // (a release settles on a majority).
    wait_until_async("the stopped node's failure is logged", LINE_TIMEOUT, || {
        captured
            .lines()
            .iter()
            .any(|line| line.contains("quorum node failed"))
    })
    .await;

    // Configuration mistakes.
    for mistake in [
        config(with_password(&nodes[0], PASSWORD)).tls_client_certificate(
            ca.client_certificate("x").certificate_pem,
            me.key_pem.clone(),
        ),
        Config::new(format!("rediss://app:{PASSWORD}@127.0.0.1:1/#insecure")),
        Config::new(format!("redis://app:{PASSWORD}@127.0.0.1:1/"))
            .tls_client_certificate(me.certificate_pem.clone(), me.key_pem.clone()),
    ] {
        shown.push(format!("{mistake:?}"));
        let error = Client::new(mistake).unwrap_err();
        assert!(matches!(error, LockError::Config { .. }), "{error:?}");
        shown.extend([format!("{error}"), format!("{error:?}")]);
    }

    let logged = captured.lines();
    for probe in [
        "TRACE tls_secrets message=probe",
        "log TRACE tls_secrets probe",
    ] {
        assert!(
            logged.iter().any(|line| line == probe),
            "{probe} not captured"
        );
    }
    assert!(
        logged.iter().any(|line| line.contains("lock not acquired")),
        "the attribute logged its error"
    );
    for line in shown.iter().chain(&logged) {
        for secret in &secrets {
            assert!(!line.contains(secret.as_str()), "a secret in: {line}");
        }
    }
}
