//! lockctl against a real redis-server (test-support): list and show a
//! held lock with a waiter blocked in another client, force release (it
//! wakes the waiter; without --force it refuses; a "n" at the prompt keeps
//! the lock), read/write locks and semaphores, watch; and the library API
//! underneath: a holder that changed between the reading and the release
//! keeps its lock.

mod common;
use common::*;

use std::time::{Duration, Instant};

use lock_runtime::admin::{HolderRole, LockKind, ReleaseOutcome};
use lock_runtime::{Client, Config, Lock, LockError, RwLock, Semaphore};
use serde_json::Value;
use test_support::RedisServer;

fn zcard(server: &RedisServer, key: &str) -> String {
    server.command(&["ZCARD", key]).unwrap()
}

/// `list` and `show` give a held lock's ttl, its waiter (blocked in
/// another client), its holder's token head and its fencing counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_a_held_lock_and_its_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let (holder, other) = (client(&url), client(&url));
    let guard = Lock::new("order:42")
        .ttl(Duration::from_secs(60))
        .fencing()
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let _free = Lock::new("unrelated")
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&other, "order:42");
    wait_until("the waiter queues", || {
        zcard(&server, "lock:{order:42}:waiters") == ":1\r\n"
    })
    .await;
    let token = guard.token().to_owned();
    let fence = guard.fencing_token().unwrap().to_string();

    let list = lockctl(&url, &["list", "order:"], "").await;
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.starts_with("NAME"), "{list:?}");
    assert!(row(&list.stdout, "unrelated").is_none(), "{list:?}");
    let columns = row(&list.stdout, "order:42").expect("a row for order:42");
    assert_eq!(columns["KIND"], "lock", "{list:?}");
    let ttl: f64 = columns["TTL"]
        .trim_end_matches('s')
        .parse()
        .expect("a ttl in seconds");
    assert!(ttl > 50.0 && ttl <= 60.0, "{list:?}");
    assert_eq!(columns["WAITERS"], "1", "one waiter: {list:?}");
    assert_eq!(columns["HOLDER"], token[..8], "{list:?}");
    assert_eq!(columns["FENCE"], fence, "{list:?}");

    let all = lockctl(&url, &["list"], "").await;
    assert!(row(&all.stdout, "unrelated").is_some(), "{all:?}");

    let show = lockctl(&url, &["show", "order:42"], "").await;
    assert_eq!(show.code, 0, "{show:?}");
    assert!(
        show.stdout.contains(&format!("holder:   {token}  owner")),
        "{show:?}"
    );
    assert!(show.stdout.contains("waiters:  1"), "{show:?}");
    assert!(
        show.stdout.contains(&format!("fencing:  {fence}")),
        "{show:?}"
    );
    assert!(show.stdout.contains("key lock:{order:42}"), "{show:?}");

    let json = lockctl(&url, &["--json", "show", "order:42"], "").await;
    assert!(
        json.stdout.starts_with("[{\"name\":\"order:42\""),
        "{json:?}"
    );
    assert!(
        json.stdout.contains(&format!("\"token\":\"{token}\"")),
        "{json:?}"
    );
    assert!(json.stdout.contains("\"waiters\":1"), "{json:?}");

    // Like `kubectl get` of a missing object: exit 1, said on stderr.
    let missing = lockctl(&url, &["show", "nothing-here"], "").await;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stdout.is_empty(), "{missing:?}");
    assert!(
        missing
            .stderr
            .contains("lock `nothing-here` not found: Redis has no key of it"),
        "{missing:?}"
    );
    let missing = lockctl(&url, &["--json", "show", "nothing-here"], "").await;
    assert_eq!(
        (missing.code, missing.stdout.as_str()),
        (1, "[]\n"),
        "{missing:?}"
    );

    guard.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// `release --force --yes` frees the lock on its holder's behalf: the
/// waiter is woken by the release's message (lockctl says so, and it gets
/// the lock long before the holder's ttl), and the holder is told it lost
/// the lock when it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_the_lock_and_wakes_the_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let (holder, other) = (client(&url), client(&url));
    let guard = Lock::new("stuck")
        .ttl(Duration::from_secs(60))
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&other, "stuck");
    wait_until("the waiter queues", || {
        zcard(&server, "lock:{stuck}:waiters") == ":1\r\n"
    })
    .await;
    // The waiter's client listens on its channel before the release.
    let channel = queued_channel(
        &server
            .command(&["LRANGE", "lock:{stuck}:queue", "0", "-1"])
            .unwrap(),
    );
    wait_until("the waiter's client listens", || {
        numsub(&server.command(&["PUBSUB", "NUMSUB", &channel]).unwrap()) == 1
    })
    .await;

    let started = Instant::now();
    let release = lockctl(&url, &["release", "stuck", "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    assert!(
        release.stdout.contains(&format!(
            "holder {} (owner): released; a waiting client was woken",
            &guard.token()[..8]
        )),
        "{release:?}"
    );
    assert!(release.stderr.contains("force release by"), "{release:?}");
    let next = tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not by the ttl"
    );
    let owner = server.command(&["GET", "lock:{stuck}"]).unwrap();
    assert!(owner.contains(next.token()), "{owner}");
    let old = guard.release().await;
    assert!(
        matches!(old, Err(LockError::Lost { .. })),
        "the old holder learns it: {old:?}"
    );
    next.release().await.unwrap();
}

/// Without --force nothing is released and the message says what to add;
/// a "n" (or no answer) at the prompt keeps the lock; "y" releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_needs_force_and_a_yes() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url);
    let guard = Lock::new("kept")
        .ttl(Duration::from_secs(60))
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let held = || {
        server
            .command(&["GET", "lock:{kept}"])
            .unwrap()
            .contains(guard.token())
    };

    let refused = lockctl(&url, &["release", "kept"], "y\n").await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(held());

    for answer in ["n\n", "", "maybe\n"] {
        let declined = lockctl(&url, &["release", "kept", "--force"], answer).await;
        assert_eq!(declined.code, 3, "{declined:?}");
        assert!(declined.stderr.contains("[y/N]"), "{declined:?}");
        assert!(declined.stderr.contains("not confirmed"), "{declined:?}");
        assert!(held(), "answer {answer:?} kept the lock");
    }

    let confirmed = lockctl(&url, &["release", "kept", "--force"], "y\n").await;
    assert_eq!(confirmed.code, 0, "{confirmed:?}");
    assert!(confirmed.stdout.contains("released"), "{confirmed:?}");
    assert!(!held());

    let again = lockctl(&url, &["release", "kept", "--force", "--yes"], "").await;
    assert_eq!(again.code, 3, "{again:?}");
    assert!(again.stderr.contains("not held"), "{again:?}");
    drop(guard);
}

/// The library API lockctl uses: a holder read before it changed is not
/// released: the new holder keeps the lock (one owner-checked script call,
/// so there is no window between the check and the delete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_changed_keeps_the_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let (one, other, admin) = (client(&url), client(&url), client(&url));
    let first = Lock::new("moving")
        .ttl(Duration::from_secs(60))
        .client(one.clone())
        .try_acquire()
        .await
        .unwrap();
    let read = admin.lock_info("moving").await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].kind, LockKind::Exclusive);
    let stale = read[0].holding().next().unwrap().clone();
    assert_eq!(stale.token, first.token());
    assert_eq!(stale.role, HolderRole::Owner);

    // The lock changes hands after it was read.
    first.release().await.unwrap();
    let second = Lock::new("moving")
        .ttl(Duration::from_secs(60))
        .client(other.clone())
        .try_acquire()
        .await
        .unwrap();
    let outcome = admin
        .release_holder("moving", LockKind::Exclusive, &stale)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::HolderChanged);
    let now = admin.lock_info("moving").await.unwrap();
    assert_eq!(now[0].holding().next().unwrap().token, second.token());
    assert!(second.is_held());
    second.release().await.unwrap();

    // And once nobody holds it: nothing to do.
    let outcome = admin
        .release_holder("moving", LockKind::Exclusive, &stale)
        .await
        .unwrap();
    assert_eq!(outcome, ReleaseOutcome::Gone);
    assert!(admin
        .force_release("moving", LockKind::Exclusive)
        .await
        .unwrap()
        .is_empty());
    assert!(admin.lock_info("moving").await.unwrap().is_empty());
    drop(server);
}

/// Read/write locks and semaphores are listed with their kind and
/// holders, and force-released holder by holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_and_semaphores() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url);
    let rw = RwLock::new("prices").client(holder.clone());
    let readers = [
        rw.read().try_acquire().await.unwrap(),
        rw.read().try_acquire().await.unwrap(),
    ];
    let semaphore = Semaphore::new("exports", 5).client(holder.clone());
    let permits = semaphore.try_acquire_many(2).await.unwrap();
    let writer = RwLock::new("catalog")
        .client(holder.clone())
        .write()
        .try_acquire()
        .await
        .unwrap();

    let list = lockctl(&url, &["list"], "").await;
    assert_eq!(list.code, 0, "{list:?}");
    let line = |name: &str| {
        list.stdout
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name}: {list:?}"))
            .to_owned()
    };
    assert!(line("prices").contains(" rw "), "{list:?}");
    assert!(line("prices").contains("2 readers"), "{list:?}");
    assert!(line("exports").contains("semaphore 2/5"), "{list:?}");
    assert!(
        line("exports").contains(&format!("{} (2)", &permits.token()[..8])),
        "{list:?}"
    );
    assert!(
        line("catalog").contains(&format!("{} (w)", &writer.token()[..8])),
        "{list:?}"
    );

    let release = lockctl(&url, &["release", "prices", "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    assert_eq!(
        release.stdout.matches("(reader): released").count(),
        2,
        "{release:?}"
    );
    let release = lockctl(&url, &["release", "exports", "--force", "--yes"], "").await;
    assert!(
        release.stdout.contains("(2 permits): released"),
        "{release:?}"
    );
    let release = lockctl(
        &url,
        &["release", "catalog", "--force", "--yes", "--kind", "rw"],
        "",
    )
    .await;
    assert!(release.stdout.contains("(writer): released"), "{release:?}");
    let list = lockctl(&url, &["list"], "").await;
    assert_eq!(list.stdout, "no locks\n", "{list:?}");
    for guard in readers {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    assert!(permits.release().await.unwrap_err().is_lost());
    assert!(writer.release().await.unwrap_err().is_lost());
}

/// Two names in use as two kinds of lock: release asks which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_as_two_kinds_needs_kind() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url);
    let exclusive = Lock::new("twice")
        .client(holder.clone())
        .try_acquire()
        .await
        .unwrap();
    let read = RwLock::new("twice")
        .client(holder.clone())
        .read()
        .try_acquire()
        .await
        .unwrap();
    let release = lockctl(&url, &["release", "twice", "--force", "--yes"], "").await;
    assert_eq!(release.code, 2, "{release:?}");
    assert!(release.stderr.contains("--kind"), "{release:?}");
    let release = lockctl(
        &url,
        &["release", "twice", "--force", "--yes", "--kind", "lock"],
        "",
    )
    .await;
    assert_eq!(release.code, 0, "{release:?}");
    assert!(read.is_held());
    read.release().await.unwrap();
    assert!(exclusive.release().await.unwrap_err().is_lost());
}

/// `watch` refreshes every interval, `--count` times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_refreshes() {
    let server = RedisServer::start();
    let url = server.url();
    let guard = Lock::new("watched")
        .client(client(&url))
        .try_acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let watch = lockctl(&url, &["watch", "--interval", "200ms", "--count", "3"], "").await;
    assert_eq!(watch.code, 0, "{watch:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(
        watch.stdout.matches("lockctl watch: all locks on").count(),
        3,
        "{watch:?}"
    );
    assert_eq!(
        watch.stdout.matches(&guard.token()[..8]).count(),
        3,
        "{watch:?}"
    );
    assert!(watch.stdout.contains("refresh 3"), "{watch:?}");
    guard.release().await.unwrap();
}

/// Users' passwords never appear in lockctl's output: neither when it
/// works (with an ACL user allowed the library's rule, plus the `SCAN`,
/// `ZCOUNT` and `HGETALL` lockctl needs), nor when the password is wrong, nor when Redis
/// is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_appears() {
    const PASSWORD: &str = "Sup3rS3cretPw";
    let server = RedisServer::start();
    // The library's rule, plus what lockctl needs.
    let mut acl = vec!["ACL", "SETUSER", "operator", "on", ">Sup3rS3cretPw"];
    acl.extend_from_slice(test_support::LOCK_ACL);
    acl.extend(["+scan", "+zcount", "+hgetall"]);
    assert!(server.command(&acl).unwrap().starts_with("+OK"));
    let url = format!("redis://operator:{PASSWORD}@127.0.0.1:{}/", server.port());
    let guard = Lock::new("secretive")
        .client(client(&url))
        .try_acquire()
        .await
        .unwrap();
    // Checked first, before any assertion that might print the output.
    let leak_free = |run: Run| {
        assert!(
            !run.all().contains(PASSWORD) && !run.all().contains("S3cret"),
            "the password leaked: {run:?}"
        );
        run
    };
    let list = leak_free(lockctl(&url, &["list"], "").await);
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.contains(&guard.token()[..8]), "{list:?}");
    let show = leak_free(lockctl(&url, &["show", "secretive"], "").await);
    assert_eq!(show.code, 0, "{show:?}");
    let watch = leak_free(lockctl(&url, &["watch", "--count", "1"], "").await);
    assert!(
        watch.stdout.contains("redis://operator:***@127.0.0.1"),
        "{watch:?}"
    );
    let declined = leak_free(lockctl(&url, &["release", "secretive", "--force"], "n\n").await);
    assert_eq!(declined.code, 3, "{declined:?}");
    let release = leak_free(lockctl(&url, &["release", "secretive", "--force", "--yes"], "").await);
    assert_eq!(release.code, 0, "{release:?}");
    assert!(
        release.stderr.contains("redis://operator:***@"),
        "{release:?}"
    );

    let wrong = format!("redis://operator:{PASSWORD}x@127.0.0.1:{}/", server.port());
    let denied = leak_free(lockctl(&wrong, &["list"], "").await);
    assert_eq!(denied.code, 1, "{denied:?}");
    assert!(
        denied.stderr.contains("redis://operator:***@"),
        "{denied:?}"
    );
    let port = server.port();
    drop(server);
    let down = leak_free(
        lockctl(
            &format!("redis://operator:{PASSWORD}@127.0.0.1:{port}/"),
            &["show", "secretive"],
            "",
        )
        .await,
    );
    assert_eq!(down.code, 1, "{down:?}");
    drop(guard);
}

/// No URL at all: a usage error that says what to give.
#[test]
fn no_url_says_what_to_give() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("list")
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--url") && stderr.contains("REDIS_URL"),
        "{stderr}"
    );
}

/// `--key-prefix` reads locks of a client configured with another prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_prefix() {
    let server = RedisServer::start();
    let url = server.url();
    let prefixed =
        lock_runtime::Client::new(lock_runtime::Config::new(url.as_str()).key_prefix("app:locks:"))
            .unwrap();
    let guard = Lock::new("nightly")
        .client(prefixed)
        .try_acquire()
        .await
        .unwrap();
    let default = lockctl(&url, &["list"], "").await;
    assert_eq!(default.stdout, "no locks\n", "{default:?}");
    let list = lockctl(&url, &["--key-prefix", "app:locks:", "list"], "").await;
    let columns = row(&list.stdout, "nightly").expect("a row for nightly");
    assert_eq!(columns["HOLDER"], guard.token()[..8], "{list:?}");
    let show = lockctl(&url, &["show", "nightly", "--key-prefix", "app:locks:"], "").await;
    assert!(show.stdout.contains("key app:locks:{nightly}"), "{show:?}");
    guard.release().await.unwrap();
}

/// A lock kept by `hold_at_least` after its release is listed as kept, and
/// a forced release ends the hold early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_can_be_ended_early() {
    let server = RedisServer::start();
    let url = server.url();
    let guard = Lock::new("nightly")
        .hold_at_least(Duration::from_secs(60))
        .client(client(&url))
        .try_acquire()
        .await
        .unwrap();
    let head = guard.token()[..8].to_owned();
    guard.release().await.unwrap();
    let list = lockctl(&url, &["list"], "").await;
    let columns = row(&list.stdout, "nightly").expect("a row for nightly");
    assert_eq!(columns["HOLDER"], format!("{head} kept"), "{list:?}");
    let release = lockctl(&url, &["release", "nightly", "--force", "--yes"], "").await;
    assert_eq!(release.code, 0, "{release:?}");
    assert!(
        release
            .stdout
            .contains(&format!("holder {head} (kept by hold_at_least): released")),
        "{release:?}"
    );
    assert_eq!(
        server.command(&["EXISTS", "lock:{nightly}"]).unwrap(),
        ":0\r\n"
    );
}

/// A scheduled job's lock, kept by `hold_at_least` after a job that took
/// 50 ms: `show` names the instance and the function that ran it for as
/// long as the key is kept (its holder record entry outlives the release
/// while the key lives), then the entry goes with the key's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lock_shows_who_ran_the_job_while_the_key_lives() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = Client::new(Config::new(url.clone()).instance("reports-7")).unwrap();
    Lock::new("report:today")
        .hold_at_least(Duration::from_secs(6))
        .caller("reports::daily")
        .client(locks.clone())
        .run(tokio::time::sleep(Duration::from_millis(50)))
        .await
        .unwrap();
    // The hold is recorded a second after it was taken, though released.
    let record = format!("lock:client:{{{}}}", locks.id());
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let fields = server.command(&["HLEN", &record]).unwrap();
        if fields != ":0\r\n" && fields != ":6\r\n" {
            break; // identity (6 fields) and the hold
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the hold is never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let show = lockctl(&url, &["show", "report:today"], "").await;
    assert!(show.stdout.contains("kept by hold_at_least"), "{show:?}");
    assert!(show.stdout.contains("instance: reports-7"), "{show:?}");
    assert!(show.stdout.contains("function: reports::daily"), "{show:?}");
    assert!(!show.stdout.contains("no record"), "{show:?}");
    // Once the key's kept time is over, the entry goes too.
    let deadline = std::time::Instant::now() + PATIENCE;
    while server.command(&["HLEN", &record]).unwrap() != ":0\r\n" {
        assert!(
            std::time::Instant::now() < deadline,
            "the entry outlives the kept key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        server.command(&["EXISTS", "lock:{report:today}"]).unwrap(),
        ":0\r\n"
    );
}

/// A time as lockctl prints it: RFC 3339, UTC, to the millisecond
/// (`2026-11-23T14:03:07.250Z`).
fn is_rfc3339_utc(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 24
        && bytes.iter().enumerate().all(|(at, b)| match at {
            4 | 7 => *b == b'-',
            10 => *b == b'T',
            13 | 16 => *b == b':',
            19 => *b == b'.',
            23 => *b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

/// `list`, `show` and `--json` name each holder: its instance, host and
/// process, the function that took the lock and since when (from its
/// client's holder record), or "unknown (no record)" for a token no record
/// speaks for; and a forced release shows whom it is about to release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_name_the_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = Client::new(Config::new(url.as_str()).instance("orders-1")).unwrap();
    let guard = Lock::new("order:7")
        .caller("orders::settle")
        .ttl(Duration::from_secs(60))
        .client(holder.clone())
        .acquire()
        .await
        .unwrap();
    let token = guard.token().to_owned();
    // A lock whose token no record speaks for (its process long gone).
    let ghost = "0123456789abcdef0123456789abcdef";
    server
        .command(&["SET", "lock:{ghost}", ghost, "PX", "60000"])
        .unwrap();

    let list = list_until(&url, "the holder is named", |list| {
        row(&list.stdout, "order:7").is_some_and(|row| row["INSTANCE"] == "orders-1")
    })
    .await;
    let columns = row(&list.stdout, "order:7").unwrap();
    assert_eq!(columns["FUNCTION"], "orders::settle", "{list:?}");
    assert!(columns["SINCE"].ends_with('s'), "{list:?}");
    assert_eq!(columns["HOLDER"], token[..8], "{list:?}");
    let ghost_row = row(&list.stdout, "ghost").expect("a row for ghost");
    assert_eq!(ghost_row["INSTANCE"], "unknown (no record)", "{list:?}");
    assert_eq!(ghost_row["FUNCTION"], "-", "{list:?}");

    let show = lockctl(&url, &["show", "order:7"], "").await;
    assert_eq!(show.code, 0, "{show:?}");
    let pid = std::process::id();
    assert!(
        show.stdout.contains("instance: orders-1 (host ")
            && show.stdout.contains(&format!(", pid {pid}, lock-runtime ")),
        "{show:?}"
    );
    assert!(show.stdout.contains("function: orders::settle"), "{show:?}");
    let since = show
        .stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("since:"))
        .expect("a since line");
    assert!(
        is_rfc3339_utc(since.split_whitespace().next().unwrap()),
        "{show:?}"
    );
    let show_ghost = lockctl(&url, &["show", "ghost"], "").await;
    assert!(
        show_ghost.stdout.contains("unknown (no record)"),
        "{show_ghost:?}"
    );
    // What "no record" may mean, truthfully: not only a dead process.
    for reason in ["under a second ago", "`hset`", "for a minute"] {
        assert!(
            show_ghost.stdout.contains(reason),
            "{reason}: {show_ghost:?}"
        );
    }
    // A kept lock without a record: released, and its process gone since.
    server
        .command(&[
            "SET",
            "lock:{kept-ghost}",
            &format!("kept:{ghost}"),
            "PX",
            "60000",
        ])
        .unwrap();
    let show_kept = lockctl(&url, &["show", "kept-ghost"], "").await;
    assert!(
        show_kept
            .stdout
            .contains("released and is kept by hold_at_least")
            && !show_kept.stdout.contains("under a second ago"),
        "{show_kept:?}"
    );

    let json = lockctl(&url, &["--json", "show", "order:7"], "").await;
    let value: Value = serde_json::from_str(&json.stdout).expect("JSON");
    let record = &value[0]["holders"][0]["record"];
    assert_eq!(record["instance"], "orders-1", "{json:?}");
    assert_eq!(record["client"], holder.id(), "{json:?}");
    assert_eq!(record["pid"], pid, "{json:?}");
    assert_eq!(record["function"], "orders::settle", "{json:?}");
    assert!(
        is_rfc3339_utc(record["since"].as_str().unwrap()),
        "{json:?}"
    );
    let json = lockctl(&url, &["--json", "show", "ghost"], "").await;
    let value: Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert!(value[0]["holders"][0]["record"].is_null(), "{json:?}");

    let declined = lockctl(&url, &["release", "order:7", "--force"], "n\n").await;
    assert!(
        declined.stderr.contains("instance orders-1, host ")
            && declined.stderr.contains("function orders::settle"),
        "{declined:?}"
    );
    guard.release().await.unwrap();
}

/// Every argument has help, in `lockctl <command> --help`.
#[test]
fn every_argument_has_help() {
    for (command, wanted) in [
        (
            vec!["list", "--help"],
            "Only the locks whose name starts with PREFIX",
        ),
        (
            vec!["watch", "--help"],
            "Only the locks whose name starts with PREFIX",
        ),
        (
            vec!["show", "--help"],
            "The lock's name, as its users give it",
        ),
        (vec!["release", "--help"], "The name of the lock to release"),
        (vec!["--help"], "tls-rustls"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
            .args(&command)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{command:?}: {help}");
        assert!(help.contains(wanted), "{command:?}: {help}");
    }
}

/// A Redis that cannot be reached: the error says what lockctl was doing,
/// where, and what to check; never "Redis scan for lock `*` failed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_error_says_what_failed_and_what_to_do() {
    // Nothing accepts connections there, and no other test's server can
    // take the port meanwhile.
    let refused = test_support::RefusedPort::new().unwrap();
    let port = refused.port();
    let url = format!("redis://127.0.0.1:{port}/");
    let list = lockctl(&url, &["list", "order:"], "").await;
    assert_eq!(list.code, 1, "{list:?}");
    assert!(
        list.stderr.starts_with(&format!(
            "lockctl: cannot list the locks `order:*`: nothing accepts connections at \
             redis://127.0.0.1:{port}/"
        )),
        "{list:?}"
    );
    assert!(
        list.stderr
            .contains("start Redis there, or give its address with --url or REDIS_URL"),
        "{list:?}"
    );
    assert!(!list.stderr.contains("for lock `"), "{list:?}");
    let show = lockctl(&url, &["show", "order:7"], "").await;
    assert!(
        show.stderr
            .starts_with("lockctl: cannot read lock `order:7`: nothing accepts"),
        "{show:?}"
    );
    // A wrong password.
    let server = RedisServer::start();
    server
        .command(&["ACL", "SETUSER", "operator", "on", ">right", "+@all", "~*"])
        .unwrap();
    let wrong = format!("redis://operator:wrong@127.0.0.1:{}/", server.port());
    let denied = lockctl(&wrong, &["list"], "").await;
    assert_eq!(denied.code, 1, "{denied:?}");
    assert!(
        denied.stderr.contains("refused the credentials")
            && denied
                .stderr
                .contains("check the user name and password in the URL"),
        "{denied:?}"
    );
}

/// `watch --json` prints one JSON object per refresh, each with its time
/// (RFC 3339, UTC) and number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_lines_carry_their_time() {
    let server = RedisServer::start();
    let url = server.url();
    let guard = Lock::new("watched")
        .client(client(&url))
        .try_acquire()
        .await
        .unwrap();
    let watch = lockctl(
        &url,
        &["--json", "watch", "--interval", "100ms", "--count", "2"],
        "",
    )
    .await;
    assert_eq!(watch.code, 0, "{watch:?}");
    let lines: Vec<Value> = watch
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{watch:?}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["refresh"], i as u64 + 1, "{watch:?}");
        assert!(is_rfc3339_utc(line["time"].as_str().unwrap()), "{watch:?}");
        assert_eq!(line["locks"][0]["name"], "watched", "{watch:?}");
        assert_eq!(
            line["locks"][0]["holders"][0]["token"],
            guard.token(),
            "{watch:?}"
        );
    }
    assert!(lines[0]["time"].as_str() <= lines[1]["time"].as_str());
    guard.release().await.unwrap();
}

/// The TLS feature has one name, `tls-rustls`, in lockctl's Cargo.toml, its
/// help and lock_runtime's guide page on lockctl; a `rediss://` URL on a build without it says how to
/// build lockctl with TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_feature_has_one_name_and_its_advice() {
    let manifest = include_str!("../Cargo.toml");
    assert!(
        manifest.contains("tls-rustls = [\"lock-runtime/tls-rustls\"]"),
        "{manifest}"
    );
    let section = include_str!("../../lock-runtime/src/guide/operating.md");
    assert!(section.contains("--features tls-rustls"));
    assert!(
        !section.contains("`tls` feature"),
        "the guide names a `tls` feature"
    );
    // Nothing accepts connections there, and no other test's server can
    // take the port meanwhile.
    let refused = test_support::RefusedPort::new().unwrap();
    let port = refused.port();
    let run = lockctl(&format!("rediss://127.0.0.1:{port}/"), &["list"], "").await;
    assert_eq!(run.code, 1, "{run:?}");
    if run.stderr.contains("built without") {
        assert!(
            run.stderr
                .contains("cargo install --path lockctl --features tls-rustls"),
            "{run:?}"
        );
        assert!(!run.stderr.contains("Cargo.toml"), "{run:?}");
    } else {
        // This build has TLS (a workspace build turns on lock-runtime's
        // feature for the tests): the URL is tried, and refused.
        assert!(
            run.stderr.contains("nothing accepts connections"),
            "{run:?}"
        );
    }
}
