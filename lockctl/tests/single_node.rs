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
use lock_runtime::{Lock, LockError, RwLock, Semaphore};
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
    assert_eq!(columns[1], "lock", "{list:?}");
    let ttl: f64 = columns[2]
        .trim_end_matches('s')
        .parse()
        .expect("a ttl in seconds");
    assert!(ttl > 50.0 && ttl <= 60.0, "{list:?}");
    assert_eq!(columns[3], "1", "one waiter: {list:?}");
    assert_eq!(columns[4], token[..8], "{list:?}");
    assert_eq!(columns[5], fence, "{list:?}");

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

    let free = lockctl(&url, &["show", "nothing-here"], "").await;
    assert_eq!(free.code, 0, "{free:?}");
    assert!(free.stdout.contains("free"), "{free:?}");

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
/// works (with an ACL user allowed the library's rule, plus the `SCAN` and
/// `ZCOUNT` lockctl needs), nor when the password is wrong, nor when Redis
/// is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_appears() {
    const PASSWORD: &str = "Sup3rS3cretPw";
    let server = RedisServer::start();
    // The library's rule, plus what lockctl needs.
    let mut acl = vec!["ACL", "SETUSER", "operator", "on", ">Sup3rS3cretPw"];
    acl.extend_from_slice(test_support::LOCK_ACL);
    acl.extend(["+scan", "+zcount"]);
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
    assert_eq!(columns[4], guard.token()[..8], "{list:?}");
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
    assert_eq!(columns[4..6], [head.clone(), "kept".to_owned()], "{list:?}");
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
