//! Holder identity: every lock, share and permit is traced to its holder
//! (instance, host, pid, function, since) through its client's holder
//! record, `lock:client:{<client id>}`, which a background task writes
//! once a hold has lasted a second, refreshes, rewrites when it is gone
//! and deletes when the client holds nothing; an acquisition sends nothing
//! more than before.

mod common;
use common::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::admin::LockKind;
use lock_runtime::{distributed_lock, Client, Config, Lock, LockError, RwLock, Semaphore};

fn hget(server: &RedisServer, key: &str, field: &str) -> Option<String> {
    value(&redis(server, &["HGET", key, field]))
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis(server, &["EXISTS", key]) == ":1\r\n"
}

fn record_key(client: &Client) -> String {
    format!("lock:client:{{{}}}", client.id())
}

/// The record's field of the hold whose token is `token`.
fn hold_field(token: &str) -> String {
    format!("h:{}", &token[..16])
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_for_a_second_is_traced_to_its_holder() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url()).instance("billing-7")).unwrap();
    assert_eq!(client.instance(), "billing-7");
    assert_eq!(client.id().len(), 16);
    let taken_ms = now_ms();
    let guard = Lock::new("invoice:9")
        .caller("billing::close_invoice")
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let token = guard.token().to_owned();
    assert_eq!(token.len(), 32);
    assert!(token.ends_with(client.id()), "{token} {}", client.id());
    let key = record_key(&client);
    let field = hold_field(&token);
    wait_until_async("the hold is recorded", LINE_TIMEOUT, || {
        hget(&server, &key, &field).is_some()
    })
    .await;
    let hold = hget(&server, &key, &field).unwrap();
    let parts: Vec<&str> = hold.splitn(4, '|').collect();
    assert_eq!(
        parts[1..],
        ["lock", "billing::close_invoice", "invoice:9"],
        "{hold}"
    );
    let since: u64 = parts[0].parse().unwrap();
    assert!(
        since + 1_000 >= taken_ms && since <= now_ms(),
        "{since} {taken_ms}"
    );
    assert_eq!(
        hget(&server, &key, "instance").as_deref(),
        Some("billing-7")
    );
    assert_eq!(hget(&server, &key, "client").as_deref(), Some(client.id()));
    assert_eq!(
        hget(&server, &key, "pid"),
        Some(std::process::id().to_string())
    );
    assert!(hget(&server, &key, "host").is_some_and(|host| !host.is_empty()));
    assert_eq!(
        hget(&server, &key, "version").as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
    let ttl: i64 = value(&redis(&server, &["PTTL", &key]))
        .unwrap()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");

    // The admin API (lockctl) reads it back.
    let info = client.lock_info("invoice:9").await.unwrap();
    let record = info[0].holders[0].record.clone().expect("a record");
    assert_eq!(record.instance, "billing-7");
    assert_eq!(record.client, client.id());
    assert_eq!(record.pid, Some(std::process::id()));
    assert_eq!(record.function.as_deref(), Some("billing::close_invoice"));
    assert!(record.since.is_some());

    guard.release().await.unwrap();
    wait_until_async(
        "the record is deleted once nothing is held",
        LINE_TIMEOUT,
        || !exists(&server, &key),
    )
    .await;
}

#[distributed_lock(key = "report:<day>", ttl = "10s", client = client)]
async fn build_report(
    day: u32,
    client: &Client,
    done: tokio::sync::oneshot::Receiver<()>,
) -> Result<u32, LockError> {
    let _ = done.await;
    Ok(day)
}

/// The attribute names its function; read shares and permits are traced
/// one by one; the default instance is `<host>:<pid>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_shares_and_permits_are_traced() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let instance = client.instance().to_owned();
    assert!(
        instance.ends_with(&format!(":{}", std::process::id())),
        "{instance}"
    );
    let (done, finish) = tokio::sync::oneshot::channel();
    let report = tokio::spawn({
        let client = client.clone();
        async move { build_report(7, &client, finish).await }
    });
    let reader = RwLock::new("prices")
        .caller("quotes::read_prices")
        .client(client.clone())
        .read()
        .acquire()
        .await
        .unwrap();
    let other_reader = RwLock::new("prices")
        .client(client.clone())
        .read()
        .acquire()
        .await
        .unwrap();
    let permits = Semaphore::new("exports", 3)
        .caller("exports::run")
        .client(client.clone())
        .acquire_many(2)
        .await
        .unwrap();
    let admin = Client::new(Config::new(server.url())).unwrap();
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    loop {
        let all = recorded(
            &admin,
            &instance,
            "report:7",
            LockKind::Exclusive,
            Some("holders::build_report"),
        )
        .await
            && recorded(
                &admin,
                &instance,
                "prices",
                LockKind::ReadWrite,
                Some("quotes::read_prices"),
            )
            .await
            && recorded(&admin, &instance, "prices", LockKind::ReadWrite, None).await
            && recorded(
                &admin,
                &instance,
                "exports",
                LockKind::Semaphore,
                Some("exports::run"),
            )
            .await;
        if all {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every hold was recorded: {:?}",
            redis(&server, &["HGETALL", &record_key(&client)])
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fields = redis(&server, &["HGETALL", &record_key(&client)]);
    assert!(
        fields.contains("|permits:2|exports::run|exports"),
        "{fields}"
    );
    assert!(fields.contains("|read||prices"), "{fields}");
    done.send(()).unwrap();
    assert_eq!(report.await.unwrap().unwrap(), 7);
    reader.release().await.unwrap();
    other_reader.release().await.unwrap();
    permits.release().await.unwrap();
    wait_until_async("the record is deleted", LINE_TIMEOUT, || {
        !exists(&server, &record_key(&client))
    })
    .await;
}

/// Whether every holder of `name`'s lock of `kind` has a record of
/// `instance` with a time, and one of them `function`.
async fn recorded(
    admin: &Client,
    instance: &str,
    name: &str,
    kind: LockKind,
    function: Option<&str>,
) -> bool {
    let locks = admin.lock_info(name).await.unwrap();
    let Some(lock) = locks.iter().find(|lock| lock.kind == kind) else {
        return false;
    };
    let records: Vec<_> = lock
        .holders
        .iter()
        .map(|holder| holder.record.as_ref())
        .collect();
    !records.is_empty()
        && records.iter().all(|record| {
            record.is_some_and(|record| record.since.is_some() && record.instance == instance)
        })
        && records
            .iter()
            .any(|record| record.is_some_and(|record| record.function.as_deref() == function))
}

/// The per-command counts Redis keeps (`INFO commandstats`), without
/// `info` and `config` themselves.
fn commands(server: &RedisServer) -> Vec<(String, u64)> {
    let info = redis(server, &["INFO", "commandstats"]);
    let mut counts: Vec<(String, u64)> = info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').next()?.strip_prefix("calls=")?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| name != "info" && !name.starts_with("config"))
        .collect();
    counts.sort();
    counts
}

/// An acquisition and a release cost what they cost before: one command
/// each, nothing for the record (a hold released within a second is never
/// written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_send_nothing_more() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let lock = Lock::new("hot").caller("hot::path").client(client.clone());
    // Connected, and the release script cached.
    lock.try_acquire().await.unwrap().release().await.unwrap();
    assert_eq!(redis(&server, &["CONFIG", "RESETSTAT"]), "+OK\r\n");
    const PAIRS: u64 = 500;
    for _ in 0..PAIRS {
        lock.try_acquire().await.unwrap().release().await.unwrap();
    }
    // `SET NX PX`, and the release script (its GET and DEL are counted
    // too): nothing else.
    let expected: Vec<(String, u64)> = ["del", "evalsha", "get", "set"]
        .into_iter()
        .map(|name| (name.to_owned(), PAIRS))
        .collect();
    assert_eq!(commands(&server), expected);
    assert!(!exists(&server, &record_key(&client)));
}

/// A record found gone (evicted, `FLUSHALL`) is written whole again at its
/// next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_found_gone_is_rewritten() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let guard = Lock::new("long")
        .ttl(Duration::from_secs(60))
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let (key, field) = (record_key(&client), hold_field(guard.token()));
    wait_until_async("the hold is recorded", LINE_TIMEOUT, || {
        hget(&server, &key, &field).is_some()
    })
    .await;
    assert_eq!(redis(&server, &["DEL", &key]), ":1\r\n");
    // Within a refresh period (10 s).
    wait_until_async("the record is back, whole", LINE_TIMEOUT, || {
        hget(&server, &key, &field).is_some() && hget(&server, &key, "instance").is_some()
    })
    .await;
    guard.release().await.unwrap();
    wait_until_async("the record is deleted", LINE_TIMEOUT, || {
        !exists(&server, &key)
    })
    .await;
}

/// Over a quorum the record is on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_has_the_record_on_every_node() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let client = quorum_client(&nodes);
    let guard = Lock::new("ledger")
        .caller("ledger::post")
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let (key, field) = (record_key(&client), hold_field(guard.token()));
    for node in &nodes {
        wait_until_async("the hold is recorded on each node", LINE_TIMEOUT, || {
            hget(node, &key, &field).is_some_and(|hold| hold.ends_with("|ledger::post|ledger"))
        })
        .await;
    }
    let info = client.lock_info("ledger").await.unwrap();
    let record = info[0].holders[0].record.as_ref().expect("a record");
    assert_eq!(record.function.as_deref(), Some("ledger::post"));
    guard.release().await.unwrap();
    for node in &nodes {
        wait_until_async("the record is deleted on each node", LINE_TIMEOUT, || {
            !exists(node, &key)
        })
        .await;
    }
}

/// Holds taken one after another over a second are written together: at
/// most one write of the record per 200 ms, not one per hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_taken_one_after_another_are_written_together() {
    let server = RedisServer::start();
    let client = Client::new(Config::new(server.url())).unwrap();
    let started = std::time::Instant::now();
    let mut guards = Vec::new();
    const HOLDS: usize = 50;
    for i in 0..HOLDS {
        let lock = Lock::new(format!("spread:{i}")).client(client.clone());
        guards.push(lock.try_acquire().await.unwrap());
        // The workload: one new hold every 20 ms.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key = record_key(&client);
    wait_until_async("every hold is recorded", LINE_TIMEOUT, || {
        value(&redis(&server, &["HLEN", &key])) == Some((HOLDS + 6).to_string())
    })
    .await;
    let elapsed = started.elapsed();
    let writes: u64 = commands(&server)
        .iter()
        .filter(|(name, _)| name == "evalsha" || name == "eval")
        .map(|(_, calls)| calls)
        .sum();
    let most = elapsed.as_millis() as u64 / 200 + 3;
    assert!(
        writes <= most,
        "{writes} writes of the record in {elapsed:?} for {HOLDS} holds"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    wait_until_async("the record is deleted", LINE_TIMEOUT, || {
        !exists(&server, &key)
    })
    .await;
}
