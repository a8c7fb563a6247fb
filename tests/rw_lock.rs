//! The read/write lock on a real Redis: shares, exclusion, waking,
//! reentrancy, fencing, renewal, and the bugs that hit Redisson's
//! RReadWriteLock (issue 891, PRs 7098 and 7251, expired unlocks).

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{Client, Config, LockError, LostCause, RwLock};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

fn score(server: &RedisServer, key: &str, member: &str) -> Option<i64> {
    value(&redis(server, &["ZSCORE", key, member])).map(|score| score.parse().unwrap())
}

/// A read share's expiry (ms, server clock): a lone reader's writer key
/// `r:<token>` (its PTTL from now), or the share's score in the ZSET.
fn share_expiry(server: &RedisServer, name: &str, token: &str) -> Option<i64> {
    let writer_key = format!("lock:{{{name}}}:rw");
    if value(&redis(server, &["GET", &writer_key])) == Some(format!("r:{token}")) {
        let left: i64 = value(&redis(server, &["PTTL", &writer_key]))?
            .parse()
            .unwrap();
        return Some(server_ms(server) + left);
    }
    score(server, &format!("{writer_key}:readers"), token)
}

/// Calls of `command` Redis has run so far (those made by scripts included).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = redis(server, &["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

fn server_ms(server: &RedisServer) -> i64 {
    let reply = redis(server, &["TIME"]);
    let parts: Vec<&str> = reply.split("\r\n").collect();
    let seconds: i64 = parts[2].parse().unwrap();
    let micros: i64 = parts[4].parse().unwrap();
    seconds * 1000 + micros / 1000
}

#[tokio::test]
async fn readers_share_each_with_its_own_expiry_and_a_writer_excludes() {
    let server = RedisServer::start();
    let lock = RwLock::new("prices")
        .ttl(Duration::from_secs(10))
        .client(client(&server));
    let before = server_ms(&server);
    let first = lock.read().try_acquire().await.unwrap();
    let second = lock.read().try_acquire().await.unwrap();
    let third = lock.read().try_acquire().await.unwrap();
    let after = server_ms(&server);
    assert_eq!(first.redis_key(), "lock:{prices}:rw");
    assert_ne!(first.token(), second.token());
    // The first reader of an idle lock took the writer key with a plain SET
    // (a lone reader); the others are members of the readers ZSET. Each
    // share has its own expiry on the server's clock.
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{prices}:rw"])),
        Some(format!("r:{}", first.token()))
    );
    // 10 s from when it was taken, between `before` and `after` (the
    // server's clock, in whole ms).
    for guard in [&first, &second, &third] {
        let expiry = share_expiry(&server, "prices", guard.token()).unwrap();
        assert!(
            expiry >= before + 9_990 && expiry <= after + 10_010,
            "{expiry} vs {before}..{after}"
        );
    }
    assert!(score(&server, "lock:{prices}:rw:readers", second.token()).is_some());
    let busy = lock.write().try_acquire().await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy:?}");
    // A ZSET reader's release leaves the lone reader and the other alone.
    third.release().await.unwrap();
    assert!(share_expiry(&server, "prices", first.token()).is_some());
    assert!(share_expiry(&server, "prices", second.token()).is_some());
    first.release().await.unwrap();
    // The other share is untouched by the lone reader's release.
    assert!(score(&server, "lock:{prices}:rw:readers", second.token()).is_some());
    assert_eq!(redis(&server, &["EXISTS", "lock:{prices}:rw"]), ":0\r\n");
    // The writer key is free, but a share in the readers set is live: the
    // write's plain `SET` succeeds, sees the share, and gives the key back.
    let busy = lock.write().try_acquire().await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy:?}");
    assert_eq!(redis(&server, &["EXISTS", "lock:{prices}:rw"]), ":0\r\n");
    assert!(score(&server, "lock:{prices}:rw:readers", second.token()).is_some());
    second.release().await.unwrap();
    assert_eq!(
        redis(&server, &["EXISTS", "lock:{prices}:rw:readers"]),
        ":0\r\n"
    );

    let writer = lock.write().try_acquire().await.unwrap();
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{prices}:rw"])).as_deref(),
        Some(writer.token())
    );
    assert!(lock.read().try_acquire().await.is_err());
    assert!(lock.write().try_acquire().await.is_err());
    writer.release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{prices}:rw"]), ":0\r\n");
}

/// The uncontended write side costs what the uncontended read costs: one
/// pipeline of two plain commands (`SET NX PX`, `EXISTS` of the readers
/// and the queue) and the release script (`GET`, `DEL`, `EXISTS`).
#[tokio::test]
async fn an_uncontended_write_is_two_plain_commands_and_the_release_script() {
    let server = RedisServer::start();
    let lock = RwLock::new("ledger")
        .ttl(Duration::from_secs(10))
        .client(client(&server));
    // Warm: the release script is loaded.
    lock.write()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let commands = [
        "set",
        "exists",
        "evalsha",
        "eval",
        "get",
        "del",
        "time",
        "zremrangebyscore",
    ];
    let before: Vec<u64> = commands.iter().map(|c| calls(&server, c)).collect();
    const PAIRS: u64 = 10;
    for _ in 0..PAIRS {
        let guard = lock.write().try_acquire().await.unwrap();
        guard.release().await.unwrap();
    }
    let per_pair: Vec<(&str, u64)> = commands
        .iter()
        .zip(&before)
        .map(|(c, before)| (*c, (calls(&server, c) - before) / PAIRS))
        .collect();
    assert_eq!(
        per_pair,
        [
            ("set", 1),
            ("exists", 2),
            ("evalsha", 1),
            ("eval", 0),
            ("get", 1),
            ("del", 1),
            ("time", 0),
            ("zremrangebyscore", 0)
        ]
    );
}

#[tokio::test]
async fn the_exclusive_lock_of_the_same_name_is_another_lock() {
    let server = RedisServer::start();
    let client = client(&server);
    let rw = RwLock::new("report").client(client.clone());
    let writer = rw.write().try_acquire().await.unwrap();
    let plain = lock_runtime::Lock::new("report")
        .client(client)
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(plain.redis_key(), "lock:{report}");
    plain.release().await.unwrap();
    writer.release().await.unwrap();
}

/// Redisson issue 891 and "an unlock of an expired share is a loss": a read
/// share that expired, released while a writer holds the lock, reports the
/// loss and leaves the writer's key as it was.
#[tokio::test]
async fn an_expired_read_release_is_a_loss_and_never_touches_the_writer() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = RwLock::new("ledger").client(client.clone());
    let reader = lock
        .clone()
        .ttl(Duration::from_millis(100))
        .read()
        .try_acquire()
        .await
        .unwrap();
    let writer = lock
        .clone()
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(5))
        .write()
        .acquire()
        .await
        .unwrap();
    let pttl_before: i64 = value(&redis(&server, &["PTTL", "lock:{ledger}:rw"]))
        .unwrap()
        .parse()
        .unwrap();
    let error = reader.release().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Lost {
                cause: LostCause::Expired,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{ledger}:rw"])).as_deref(),
        Some(writer.token())
    );
    let pttl_after: i64 = value(&redis(&server, &["PTTL", "lock:{ledger}:rw"]))
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl_after > 0 && pttl_after <= pttl_before, "{pttl_after}");
    // The release created nothing.
    assert_eq!(
        redis(&server, &["EXISTS", "lock:{ledger}:rw:readers"]),
        ":0\r\n"
    );
    writer.release().await.unwrap();
}

/// Redisson PR 7098: a dead instance's read share is not kept alive by
/// another instance's renewal, so it cannot block writers forever.
#[tokio::test]
async fn another_readers_renewal_does_not_keep_a_dead_share_alive() {
    let server = RedisServer::start();
    let (alive, dead) = (client(&server), client(&server));
    let lock = RwLock::new("catalog").ttl(Duration::from_millis(300));
    // The live reader renews every 300 ms: held through the test's waits
    // on a loaded machine.
    let renewed = lock
        .clone()
        .ttl(Duration::from_millis(900))
        .renew()
        .client(alive.clone())
        .read()
        .try_acquire()
        .await
        .unwrap();
    let died = lock
        .clone()
        .client(dead)
        .read()
        .try_acquire()
        .await
        .unwrap();
    let dead_token = died.token().to_owned();
    let dead_expiry = score(&server, "lock:{catalog}:rw:readers", &dead_token).unwrap();
    std::mem::forget(died); // the instance died: no release, no renewal
    let renewals = alive.renewal_stats().renewals_sent;
    wait_until_async(
        "the live reader was renewed past the dead share's expiry",
        LINE_TIMEOUT,
        || alive.renewal_stats().renewals_sent >= renewals + 3 && server_ms(&server) > dead_expiry,
    )
    .await;
    // The dead share kept its expiry (renewals touch only their own share)
    // and is gone once a script looks at the key.
    let writer = lock
        .clone()
        .client(alive.clone())
        .wait(LINE_TIMEOUT)
        .write();
    let waiting = tokio::spawn(async move { writer.acquire().await });
    wait_until_async("the writer queued", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{catalog}:rw:queue"]) == ":1\r\n"
    })
    .await;
    let member = score(&server, "lock:{catalog}:rw:readers", &dead_token);
    assert!(
        member.is_none() || member == Some(dead_expiry),
        "{member:?}"
    );
    assert!(renewed.is_held());
    renewed.release().await.unwrap();
    let writer = waiting.await.unwrap().unwrap();
    writer.release().await.unwrap();
}

/// Redisson PR 7251: fully releasing a reentrant read hold stops its
/// renewal.
#[tokio::test]
async fn releasing_a_reentrant_read_hold_stops_its_renewal() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = RwLock::new("inventory")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone());
    let inner_lock = lock.read();
    let token = lock
        .read()
        .run(async {
            let inner = inner_lock.acquire().await.unwrap();
            assert!(inner.is_reentrant());
            let token = inner.token().to_owned();
            inner.release().await.unwrap();
            // Still held and renewed by the outer hold.
            assert_eq!(client.renewal_stats().active, 1);
            token
        })
        .await
        .unwrap();
    assert_eq!(client.renewal_stats().active, 0);
    assert!(score(&server, "lock:{inventory}:rw:readers", &token).is_none());
    let sent = client.renewal_stats().renewals_sent;
    // Three renewal periods later nothing was renewed or recreated.
    tokio::time::sleep(Duration::from_millis(600)).await; // an observation window
    assert_eq!(client.renewal_stats().renewals_sent, sent);
    assert_eq!(
        redis(&server, &["EXISTS", "lock:{inventory}:rw:readers"]),
        ":0\r\n"
    );
}

#[tokio::test]
async fn reads_enter_reads_and_writes_at_once_and_a_write_inside_a_read_fails() {
    let server = RedisServer::start();
    let lock = RwLock::new("doc")
        .wait(Duration::from_secs(10))
        .client(client(&server));
    // Read inside write (downgrade), and two concurrent reads inside it.
    let (read, write) = (lock.read(), lock.write());
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let barrier = tokio::sync::Barrier::new(2);
    lock.write()
        .run(async {
            let enter = || async {
                read.run(async {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    barrier.wait().await; // both reads inside at once
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap()
            };
            tokio::time::timeout(Duration::from_secs(5), async {
                tokio::join!(enter(), enter())
            })
            .await
            .expect("two read entries inside a write share it");
            // A write inside the write enters too.
            write.run(async {}).await.unwrap();
        })
        .await
        .unwrap();
    assert_eq!(most.load(Ordering::SeqCst), 2);

    // Write inside read: an error at once, not a wait of 10 s.
    let result = tokio::time::timeout(
        Duration::from_secs(5),
        lock.read().run(async { write.acquire().await.map(drop) }),
    )
    .await
    .expect("a write inside a read fails at once");
    let error = result.unwrap().unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(error.to_string().contains("reading"), "{error}");
    assert!(!error.to_string().contains("  "), "{error}");
    // A write inside a read entry of a write hold: it would run beside that
    // entry's sibling reads, so it is refused too.
    let result = lock
        .write()
        .run(async {
            read.run(async { write.try_acquire().await.map(drop) })
                .await
        })
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(result, Err(LockError::Config { .. })),
        "{result:?}"
    );
    // Read inside read enters at once.
    lock.read()
        .run(async {
            let inner = read.try_acquire().await.unwrap();
            assert!(inner.is_reentrant());
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_write_release_wakes_every_queued_reader_at_once() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = RwLock::new("feed")
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(20))
        .client(client);
    let writer = lock.write().try_acquire().await.unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (read, inside, barrier) = (lock.read(), inside.clone(), barrier.clone());
            tokio::spawn(async move {
                read.run(async {
                    inside.fetch_add(1, Ordering::SeqCst);
                    // All three are inside together.
                    barrier.wait().await;
                })
                .await
            })
        })
        .collect();
    wait_until_async("three readers queued", Duration::from_secs(5), || {
        redis(&server, &["LLEN", "lock:{feed}:rw:queue"]) == ":3\r\n"
    })
    .await;
    assert_eq!(inside.load(Ordering::SeqCst), 0);
    // The writer's ttl is 30 s: the release's message lets them in (their
    // refreshes, every 500 ms, would too, later: the message is counted).
    let published = calls(&server, "publish");
    writer.release().await.unwrap();
    assert!(
        calls(&server, "publish") > published,
        "the release woke nobody"
    );
    for reader in readers {
        tokio::time::timeout(LINE_TIMEOUT, reader)
            .await
            .expect("woken by the release")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn writers_get_increasing_fencing_tokens_and_readers_none_smaller() {
    let server = RedisServer::start();
    let lock = RwLock::new("store").fencing().client(client(&server));
    let mut last = 0;
    for _ in 0..3 {
        let writer = lock.write().try_acquire().await.unwrap();
        let fence = writer.fencing_token().unwrap();
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        writer.release().await.unwrap();
        let reader = lock.read().try_acquire().await.unwrap();
        let fence = reader.fencing_token().unwrap();
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        reader.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_renewed_read_share_outlives_its_ttl_and_its_loss_stops_the_body() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = RwLock::new("cache")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone());
    // Past its ttl: renewed 4 times (every 200 ms).
    let renewed_past_the_ttl = |renewals: u64| {
        let client = client.clone();
        let sent = client.renewal_stats().renewals_sent + renewals;
        wait_until_async("renewed past the ttl", LINE_TIMEOUT, move || {
            client.renewal_stats().renewals_sent >= sent
        })
    };
    let guard = lock.read().try_acquire().await.unwrap();
    renewed_past_the_ttl(4).await;
    assert!(guard.is_held());
    // a lone reader (the writer key), renewed
    assert!(share_expiry(&server, "cache", guard.token()).is_some());
    // and a reader of the ZSET, renewed alongside it
    let member = lock.read().try_acquire().await.unwrap();
    renewed_past_the_ttl(8).await;
    assert!(guard.is_held() && member.is_held());
    assert!(score(&server, "lock:{cache}:rw:readers", member.token()).is_some());
    assert!(share_expiry(&server, "cache", guard.token()).is_some());
    member.release().await.unwrap();
    guard.release().await.unwrap();

    // A share removed behind its holder's back (a lone reader's writer key,
    // a ZSET member): the renewal finds it gone and the body is stopped.
    for lone in [true, false] {
        let other = if lone {
            None
        } else {
            Some(lock.read().try_acquire().await.unwrap())
        };
        let result = lock
            .read()
            .run(async {
                let token = lock_runtime::current().unwrap().token().to_owned();
                if lone {
                    let held = value(&redis(&server, &["GET", "lock:{cache}:rw"]));
                    assert_eq!(held, Some(format!("r:{token}")));
                    redis(&server, &["DEL", "lock:{cache}:rw"]);
                } else {
                    redis(&server, &["ZREM", "lock:{cache}:rw:readers", &token]);
                }
                std::future::pending::<()>().await;
            })
            .await;
        assert!(
            matches!(
                result,
                Err(LockError::Lost {
                    cause: LostCause::Deleted,
                    ..
                })
            ),
            "lone {lone}: {result:?}"
        );
        if let Some(other) = other {
            other.release().await.unwrap();
        }
    }
}

#[tokio::test]
async fn hold_at_least_keeps_a_write_and_is_refused_for_a_read() {
    let server = RedisServer::start();
    let lock = RwLock::new("nightly")
        .hold_at_least(Duration::from_secs(5))
        .client(client(&server));
    let writer = lock.write().try_acquire().await.unwrap();
    writer.release().await.unwrap();
    let kept = value(&redis(&server, &["GET", "lock:{nightly}:rw"])).unwrap();
    assert!(kept.starts_with("kept:"), "{kept}");
    assert!(lock.write().try_acquire().await.is_err());
    let error = lock.read().try_acquire().await.unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
}

/// Every script of the shared kinds is sent again after Redis lost its
/// script cache (SCRIPT FLUSH, then a restart on the same port): acquires
/// (lone, ZSET and waiting readers, writers, permits), renewals of a read
/// share and of a permit, and releases all work, one EVAL each.
#[tokio::test]
async fn the_shared_kinds_survive_a_script_flush_and_a_restart() {
    let mut server = RedisServer::start();
    let port = server.port();
    let client = client(&server);
    let rw = RwLock::new("flushed")
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone());
    let semaphore = lock_runtime::Semaphore::new("flushed", 2)
        .ttl(Duration::from_millis(600))
        .renew()
        .client(client.clone());
    let every_kind = || async {
        let lone = rw.read().try_acquire().await.unwrap();
        let member = rw
            .read()
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        let permit = semaphore.acquire().await.unwrap();
        // past a ttl: renewed 4 times each, every 200 ms (the lone reader,
        // the ZSET reader, the permit)
        let sent = client.renewal_stats().renewals_sent + 12;
        wait_until_async("renewed past the ttl", LINE_TIMEOUT, || {
            client.renewal_stats().renewals_sent >= sent
        })
        .await;
        assert!(lone.is_held() && member.is_held() && permit.is_held());
        for guard in [lone, member, permit] {
            guard.release().await.unwrap();
        }
        let writer = rw
            .write()
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        writer.release().await.unwrap();
    };
    every_kind().await;
    assert_eq!(redis(&server, &["SCRIPT", "FLUSH"]), "+OK\r\n");
    every_kind().await;
    server.kill();
    server = RedisServer::start_on(port).expect("restart on the same port");
    every_kind().await;
    // Nothing left (the client's holder record is deleted in the
    // background once it holds nothing).
    wait_until_async("no key is left", LINE_TIMEOUT, || {
        redis(&server, &["DBSIZE"]) == ":0\r\n"
    })
    .await;
    assert_eq!(client.renewal_stats().lost, 0);
}

/// A writer released with `hold_at_least` keeps the key as `kept:<token>`,
/// and no script runs when that ends, so the queue exists with neither
/// holder nor gate: a plain read must still not pass the queued writer
/// (which sleeps up to its 500 ms refresh), nor hold it off.
///
/// The kept hold is ended by the test (a DEL, as its expiry would: no
/// script, no message) right after the writer's attempt that follows its
/// subscription, so that the writer sleeps until its next refresh while
/// the reader arrives. On a loaded machine the reader can still come after
/// the writer is done: then the round is run again (the scenario must
/// happen in one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_read_never_passes_a_writer_queued_behind_a_kept_hold() {
    let server = RedisServer::start();
    // The reader's client, its connection open (and its scripts loaded):
    // its try below is one round trip, well inside the writer's sleep.
    let reader_client = client(&server);
    let warm = RwLock::new("warm").client(reader_client.clone());
    warm.read()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    warm.write()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    const ROUNDS: usize = 10;
    // Per round that proved nothing: when the writer and the reader got in,
    // counted from the end of the kept hold.
    let mut late = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("kept-{round}");
        let key = format!("lock:{{{name}}}:rw");
        let lock = RwLock::new(name.clone()).ttl(Duration::from_secs(10));
        let first = lock
            .clone()
            .hold_at_least(Duration::from_secs(30))
            .client(client(&server))
            .write()
            .try_acquire()
            .await
            .unwrap();
        let writer = lock
            .clone()
            .wait(LINE_TIMEOUT)
            .client(client(&server))
            .write();
        let waiting = tokio::spawn(async move {
            writer.acquire().await.map(|guard| {
                let entered = std::time::Instant::now();
                drop(guard);
                entered
            })
        });
        let queue = format!("{key}:queue");
        wait_until_async("the writer queued", LINE_TIMEOUT, || {
            redis(&server, &["LLEN", &queue]) == ":1\r\n"
        })
        .await;
        // Its attempts from here, and the release's script.
        let attempts = calls(&server, "evalsha") + calls(&server, "eval");
        let entry = value(&redis(&server, &["LINDEX", &queue, "0"])).unwrap();
        // `w|<channel>|<token>`
        let channel = entry
            .split('|')
            .find(|part| part.starts_with("lock-waiters:"))
            .unwrap()
            .to_owned();
        first.release().await.unwrap(); // kept for 30 s
        assert!(
            value(&redis(&server, &["GET", &key])).is_some_and(|v| v.starts_with("kept:")),
            "set up: the hold_at_least is kept"
        );
        // The writer subscribed and tried again (its next try is a refresh,
        // 500 ms on).
        wait_until_async(
            "the writer subscribed and tried again",
            LINE_TIMEOUT,
            || {
                redis(&server, &["PUBSUB", "NUMSUB", &channel]).ends_with(":1\r\n")
                    && calls(&server, "evalsha") + calls(&server, "eval") > attempts + 1
            },
        )
        .await;
        // The kept hold ends: no script runs.
        let ended = std::time::Instant::now();
        redis(&server, &["DEL", &key]);
        // A reader arrives (try_acquire: the plain SET first).
        let read = lock
            .clone()
            .client(reader_client.clone())
            .read()
            .try_acquire()
            .await;
        let reader_entered = read.is_ok().then(std::time::Instant::now);
        let writer_was_queued = !waiting.is_finished();
        drop(read);
        let writer_entered = tokio::time::timeout(LINE_TIMEOUT, waiting)
            .await
            .expect("the writer gets in")
            .unwrap()
            .unwrap();
        match reader_entered {
            // The plain read gave back the key it found free, and the
            // script refused it: the writer was first.
            None => return,
            // The writer was done before the reader came: no test this
            // round.
            Some(reader_entered) if writer_entered < reader_entered => {
                late.push((writer_entered - ended, reader_entered - ended));
            }
            Some(_) => panic!(
                "round {round}: a reader got in ahead of the queued writer (still queued: \
                 {writer_was_queued})"
            ),
        }
    }
    panic!(
        "in {ROUNDS} rounds the reader never came while the writer was queued: (writer in, \
         reader in) after the kept hold ended: {late:?}"
    );
}
