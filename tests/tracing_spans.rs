//! The tracing spans (`lock.acquire`, `lock.hold`, `lock.release`) and their
//! fields, read back with a capturing subscriber; and a lost lock is
//! returned and warned once, inside its `lock.hold` span.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{Client, Config, Lock, LockError};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

/// What the subscriber saw: closed spans with their fields, and events
/// with their level and the fields of the spans they are in.
#[derive(Default, Clone)]
struct Seen {
    spans: Arc<Mutex<Vec<(String, Fields)>>>,
    events: Arc<Mutex<Vec<(Level, String, Fields)>>>,
}

struct Collect(Fields);

impl Visit for Collect {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Seen {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Collect(Fields::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields.0);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut extensions = span.extensions_mut();
            if let Some(fields) = extensions.get_mut::<Fields>() {
                let mut more = Collect(std::mem::take(fields));
                values.record(&mut more);
                *fields = more.0;
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Collect(Fields::new());
        event.record(&mut fields);
        let mut in_spans = Fields::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(span_fields) = span.extensions().get::<Fields>() {
                    for (name, value) in span_fields {
                        in_spans.insert(format!("{}.{name}", span.name()), value.clone());
                    }
                }
            }
        }
        let message = fields.0.remove("message").unwrap_or_default();
        self.events
            .lock()
            .unwrap()
            .push((*event.metadata().level(), message, in_spans));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            self.spans
                .lock()
                .unwrap()
                .push((span.name().to_owned(), fields));
        }
    }
}

impl Seen {
    fn spans(&self, name: &str) -> Vec<Fields> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(span, _)| span == name)
            .map(|(_, fields)| fields.clone())
            .collect()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn spans_say_what_each_step_did() {
    let seen = Seen::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();

    let guard = Lock::new("traced")
        .fencing()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let token = guard.fencing_token().unwrap();
    let holder = guard.token().to_owned();
    let busy = Lock::new("traced")
        .client(client.clone())
        .try_acquire()
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })));
    let timed_out = Lock::new("traced")
        .wait(Duration::from_millis(50))
        .client(client.clone())
        .acquire()
        .await;
    assert!(matches!(timed_out, Err(LockError::WaitTimeout { .. })));
    guard.release().await.unwrap();
    let acquired = seen.spans("lock.acquire");
    let outcomes: Vec<&str> = acquired
        .iter()
        .map(|fields| fields["lock.outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["acquired", "busy", "timed_out"]);
    assert!(acquired
        .iter()
        .all(|fields| fields["lock.name"] == "traced"));
    assert_eq!(acquired[0]["lock.fencing_token"], token.to_string());
    // The holder: the token lockctl shows, which names the holder's client.
    assert_eq!(acquired[0]["lock.holder"], holder);
    assert!(holder.ends_with(client.id()));
    assert!(!acquired[1].contains_key("lock.holder"), "busy: no holder");
    assert!(acquired[2]["lock.waited_ms"].parse::<u64>().unwrap() >= 50);
    let released = seen.spans("lock.release");
    assert_eq!(released.len(), 1);
    assert_eq!(released[0]["lock.outcome"], "released");

    // Every event of a body carries the lock's name and fencing token.
    Lock::new("traced-body")
        .fencing()
        .client(client.clone())
        .run(async { tracing::info!("inside the body") })
        .await
        .unwrap();
    let events = seen.events.lock().unwrap().clone();
    let (_, _, in_spans) = events
        .iter()
        .find(|(_, message, _)| message == "inside the body")
        .unwrap();
    assert_eq!(in_spans["lock.hold.lock.name"], "traced-body");
    let body_holder = &in_spans["lock.hold.lock.holder"];
    assert_eq!(body_holder.len(), 32, "{body_holder}");
    assert!(body_holder.ends_with(client.id()), "{body_holder}");
    assert!(in_spans["lock.hold.lock.fencing_token"]
        .parse::<u64>()
        .is_ok());
}

/// A lost lock is returned, and logged once, at warn, inside its
/// `lock.hold` span with its cause (what operators look for); not also at
/// error by the attribute or the release.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_lock_is_returned_and_warned_once_in_its_span() {
    let seen = Seen::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let lock = Lock::new("lost")
        .ttl(Duration::from_millis(900))
        .renew()
        .client(client.clone());
    let result = lock
        .run(async {
            // Another party deletes the key: the next renewal finds it gone.
            redis(&server, &["DEL", "lock:{lost}"]);
            std::future::pending::<()>().await
        })
        .await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    // What the background renewal and release do after `run` returned is
    // logged too: wait until nothing is renewed, then make a round trip on
    // the same connection (an answer sent before it has come in by then)
    // and let the woken tasks run.
    wait_until_async("nothing is renewed", LINE_TIMEOUT, || {
        client.renewal_stats().active == 0
    })
    .await;
    Lock::new("barrier")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let events = seen.events.lock().unwrap().clone();
    let warned: Vec<_> = events
        .iter()
        .filter(|(level, _, _)| *level <= Level::WARN)
        .collect();
    assert_eq!(warned.len(), 1, "one warn per loss: {warned:?}");
    let (level, message, in_spans) = warned[0];
    assert_eq!(*level, Level::WARN);
    assert!(message.contains("lock lost"), "{message}");
    assert_eq!(in_spans["lock.hold.lock.name"], "lost");
    assert_eq!(in_spans["lock.hold.lock.lost_cause"], "deleted");
}
