//! Redis Sentinel (issue 27): a primary, two replicas and three sentinels
//! (`test_support::RedisSentinel`), reached through
//! `redis-sentinel://.../mymaster`. Locks of every kind (`fair`,
//! `hold_at_least`, `fencing`, the attribute) through it; a
//! SIGKILLed primary (kept locks renewed on the promoted replica, one it
//! never got reported lost, a waiter woken there); a manual
//! `SENTINEL FAILOVER`; one sentinel down; every sentinel down.

mod common;
use common::*;
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError, LockGuard, RwLock, Semaphore};
use test_support::sentinel::DOWN_AFTER_MS;
use test_support::{Ca, RedisSentinel, SentinelOptions, TlsOptions};

/// A client through the sentinels of `setup`.
fn client(setup: &RedisSentinel) -> Client {
    Client::new(Config::new(setup.url(""))).unwrap()
}

/// A client of `url`.
fn client_of(url: &str) -> Client {
    Client::new(Config::new(url)).unwrap()
}

/// A setup whose sentinels want a password (`requirepass`, or that of
/// their own `sentinel_user`) and whose data nodes have the user `locker`
/// with exactly the guide's minimal ACL rule; TLS only everywhere with
/// `tls`.
fn secured(tls: Option<TlsOptions>, sentinel_user: Option<&str>) -> RedisSentinel {
    let rule = ["locker", "on", ">locker-secret"]
        .iter()
        .chain(test_support::LOCK_ACL)
        .map(|item| (*item).to_owned())
        .collect();
    RedisSentinel::start_with(SentinelOptions {
        sentinel_password: Some("sentinel-secret".to_owned()),
        sentinel_user: sentinel_user.map(str::to_owned),
        node_users: vec![rule],
        tls,
        ..SentinelOptions::default()
    })
}

/// The URL of a [`secured`] setup: the data nodes as `locker`, the
/// sentinels with their password.
fn locker_url(setup: &RedisSentinel) -> String {
    setup.url("locker:locker-secret@")
}

/// A worker process locking through `url` (acknowledged by a replica when
/// `acknowledged`), its bookkeeping on `bookkeeping`.
fn worker_at(url: &str, bookkeeping: &RedisServer, args: &[&str], acknowledged: bool) -> Process {
    let mut env = vec![("BOOKKEEPING_URL", bookkeeping.url())];
    if acknowledged {
        env.push(("LOCK_ACKNOWLEDGED", "1".to_owned()));
    }
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    Process::spawn_with_env(env!("CARGO_BIN_EXE_lock-worker"), args, Some(url), &env)
}

/// The fencing token of one acquisition of `lock` (released at once).
async fn token_of(lock: &Lock) -> u64 {
    let guard = lock.try_acquire().await.unwrap();
    let token = guard.fencing_token().expect("taken with fencing");
    guard.release().await.unwrap();
    token
}

/// `server`'s clock in µs (`TIME`).
fn server_time_us(server: &RedisServer) -> u64 {
    let reply = redis(server, &["TIME"]);
    let parts: Vec<u64> = reply
        .split("\r\n")
        .filter_map(|line| line.parse().ok())
        .collect();
    parts[0] * 1_000_000 + parts[1]
}

/// The numbers in the list `key` on `server`.
fn numbers(server: &RedisServer, key: &str) -> Vec<u64> {
    redis(server, &["LRANGE", key, "0", "-1"])
        .split("\r\n")
        .filter(|line| !line.is_empty() && !line.starts_with(['*', '$']))
        .map(|line| line.parse().unwrap())
        .collect()
}

/// `GET key` on the data node on `port`.
fn get(port: u16, key: &str) -> Option<String> {
    value(&test_support::command(port, &["GET", key]).ok()?)
}

async fn hold(client: &Client, name: &str, ttl: Duration) -> LockGuard {
    Lock::new(name)
        .ttl(ttl)
        .renew()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap()
}

/// Whether `guard`'s holder had a renewal sent after `since` confirmed
/// (its validity runs from the send time of its last confirmed renewal).
fn renewed_since(guard: &LockGuard, since: Instant) -> bool {
    let ttl = guard.ttl();
    let margin = ttl / 100 + Duration::from_millis(2);
    guard.is_held() && Instant::now() + guard.remaining() >= since + ttl - margin
}

#[test]
fn the_url_forms_are_read_and_passwords_never_shown() {
    let config = Config::new(
        "redis-sentinel://locker:SECRET1@10.0.0.1:26379,10.0.0.2/mymaster?sentinel_password=SECRET2",
    );
    assert!(config.is_sentinel());
    let shown = format!("{config:?} {}", config.redacted_url());
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(shown.contains("10.0.0.1:26379"), "{shown}");
    let built = Config::sentinel(["10.0.0.1:26379", "redis://:SECRET3@10.0.0.2"], "mymaster")
        .primary_credentials("locker", "SECRET4");
    assert!(built.is_sentinel());
    let shown = format!("{built:?} {}", built.redacted_url());
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(shown.contains("mymaster"), "{shown}");
    assert!(Config::new("rediss-sentinel://s1,s2/cache").is_sentinel());
    // No master name: refused, with the form expected.
    let error = Client::new(Config::new("redis-sentinel://127.0.0.1:1")).unwrap_err();
    assert!(error.to_string().contains("master name"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_lock_works_through_the_sentinels_and_with_one_down() {
    let mut setup = RedisSentinel::start();
    let primary = setup.primary().unwrap();
    let client = client(&setup);

    let guard = Lock::new("job")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    assert!(
        get(primary, "lock:{job}").is_some(),
        "the lock is on the primary"
    );
    assert!(Lock::new("job")
        .client(client.clone())
        .try_acquire()
        .await
        .is_err());
    guard.release().await.unwrap();

    let rw = RwLock::new("prices").client(client.clone());
    let reader = rw.read().try_acquire().await.unwrap();
    assert!(rw.write().try_acquire().await.is_err());
    reader.release().await.unwrap();
    rw.write()
        .try_acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let semaphore = Semaphore::new("exports", 2).client(client.clone());
    let one = semaphore.try_acquire().await.unwrap();
    let two = semaphore.try_acquire().await.unwrap();
    assert!(semaphore.try_acquire().await.is_err());
    one.release().await.unwrap();
    two.release().await.unwrap();

    // A waiter is woken by a release (the notifier listens on the primary).
    let held = Lock::new("queue")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&client, "queue", Duration::from_secs(60));
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", "lock:{queue}:queue"]).unwrap() == ":1\r\n"
    })
    .await;
    // What lockctl shows (`Client::inspect`) is read through the sentinels.
    let shown = client.inspect("queue").await.unwrap();
    assert!(
        shown
            .iter()
            .any(|info| info.name == "queue" && info.is_held()),
        "{shown:?}"
    );
    held.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();

    // `fair`: the waiters get the lock in arrival order.
    let fair = Lock::new("line").fair().client(client.clone());
    let held = fair.try_acquire().await.unwrap();
    let mut waiters = Vec::new();
    for queued in 1..=2 {
        let lock = fair.clone().wait(Duration::from_secs(60));
        waiters.push(tokio::spawn(async move { lock.acquire().await }));
        wait_until_async("the fair waiter queues", LINE_TIMEOUT, || {
            test_support::command(primary, &["LLEN", "lock:{line}:queue"]).unwrap()
                == format!(":{queued}\r\n")
        })
        .await;
    }
    held.release().await.unwrap();
    let second = waiters.pop().unwrap();
    let first = waited(waiters.pop().unwrap()).await;
    assert!(!second.is_finished(), "the second waiter went first");
    first.release().await.unwrap();
    waited(second).await.release().await.unwrap();

    // The attribute, with `hold_at_least` and `fencing`: a second run
    // within the minimum hold finds the lock kept, and tokens increase.
    let first = report(&client, 1).await.unwrap();
    let again = report(&client, 1).await;
    assert!(again.as_ref().is_err_and(LockError::is_busy), "{again:?}");
    let kept_for = value(&test_support::command(primary, &["PTTL", "lock:{report:1}"]).unwrap());
    assert!(
        kept_for.is_some_and(|ms| ms.parse::<i64>().unwrap() > 0),
        "kept after the run"
    );
    let other_day = report(&client, 2).await.unwrap();
    assert!(other_day > first, "{first} {other_day}");

    // Acknowledged mode: the replicas confirm through the same link (a
    // loaded machine may make one confirmation miss its 500 ms: tried again,
    // bounded).
    let acked = Client::new(
        Config::new(setup.url(""))
            .response_timeout(Duration::from_secs(5))
            .acknowledged(2, Duration::from_millis(500)),
    )
    .unwrap();
    let fenced = Lock::new("acked").fencing().client(acked);
    let deadline = Instant::now() + LINE_TIMEOUT;
    let guard = loop {
        match fenced.try_acquire().await {
            Ok(guard) => break guard,
            Err(LockError::NotReplicated { .. }) if Instant::now() < deadline => continue,
            Err(error) => panic!("{error:?}"),
        }
    };
    assert!(
        get(primary, "lock:{acked}:fence").is_some(),
        "a fencing counter"
    );
    guard.release().await.unwrap();

    // One sentinel down (the first asked): a new client still finds the
    // primary through the other two.
    setup.kill_sentinel(0);
    let other = Client::new(Config::new(setup.url(""))).unwrap();
    let guard = Lock::new("job").client(other).try_acquire().await.unwrap();
    guard.release().await.unwrap();
}

/// A run under the attribute through the sentinels, kept for 10 s at
/// least (one per day), returning its fencing token.
#[lock_runtime::distributed_lock(
    key = "report:<day>",
    client = client,
    ttl = "30s",
    hold_at_least = "10s",
    fencing
)]
async fn report(client: &Client, day: u32) -> Result<u64, LockError> {
    let _ = day;
    Ok(lock_runtime::current()
        .and_then(|held| held.fencing_token())
        .expect("taken with fencing"))
}

/// The primary SIGKILLed while three worker processes run renewed,
/// fenced sections of one lock under the attribute (holding, waiting,
/// renewing), another process and this one hold renewed locks, and some
/// were taken after the replicas' links were cut. Everyone logs in as a
/// user with exactly the guide's minimal ACL rule (`LOCK_ACL`, `ROLE`
/// included), the sentinels with a password. After the promotion:
/// progress resumes (the gap from the kill to the first section is
/// printed), no two sections overlapped, fencing tokens kept increasing,
/// the kept locks (acknowledged ones too) are renewed on the new primary,
/// the ones it never got are reported lost (by their holders' next
/// renewal, within their validity) and can be taken by others, and a
/// waiter of a kept lock is woken there by its release. An acknowledged
/// acquisition after the cut was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_keeps_exclusion_across_processes_and_reports_the_lost_locks() {
    let mut setup = secured(None, None);
    let bookkeeping = RedisServer::start();
    let url = locker_url(&setup);
    let primary = setup.primary().unwrap();
    let (one, other) = (client_of(&url), client_of(&url));
    // The failover (down after 1 s, the election, the promotion: a few
    // seconds, more on a loaded machine) must end while the locks are
    // valid.
    let ttl = Duration::from_secs(20);
    let kept = [hold(&one, "a", ttl).await, hold(&one, "b", ttl).await];
    // Acknowledged by a replica: its renewals are refused from the cut to
    // the promotion (retried while it is valid: 30 s).
    let mut acked = worker_at(
        &url,
        &bookkeeping,
        &["hold-renewed", "acked", "30000"],
        true,
    );
    assert!(acked.line(LINE_TIMEOUT).starts_with("held "));
    let waiter = spawn_waiter(&other, "a", Duration::from_secs(90));
    wait_until_async("the waiter queues", LINE_TIMEOUT, || {
        test_support::command(primary, &["LLEN", "lock:{a}:queue"]).unwrap() == ":1\r\n"
    })
    .await;
    let fenced = Lock::new("fenced").fencing().client(one.clone());
    let replicated_token = token_of(&fenced).await;
    setup.wait_until_replicated().unwrap();

    // From here on, what the primary is told reaches no replica.
    setup.cut_replication(primary).unwrap();
    let unreplicated_token = token_of(&fenced).await;
    let lost = hold(&one, "lost", ttl).await;
    let mut lost_elsewhere = worker_at(
        &url,
        &bookkeeping,
        &["hold-renewed", "lost-elsewhere", "10000"],
        false,
    );
    assert!(lost_elsewhere.line(LINE_TIMEOUT).starts_with("held "));
    // Acknowledged mode refuses what no replica confirmed.
    let acknowledged = Client::new(
        Config::new(url.as_str())
            .response_timeout(Duration::from_secs(5))
            .acknowledged(1, Duration::from_millis(300)),
    )
    .unwrap();
    let refused = Lock::new("refused")
        .client(acknowledged)
        .try_acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::NotReplicated { .. })),
        "{refused:?}"
    );
    // The processes' sections run on the primary alone (their lock's state
    // is not on the replicas: a section's release lost in the failover
    // would leave the lock held until its ttl).
    let mut sections: Vec<Process> = (0..3)
        .map(|_| {
            worker_at(
                &url,
                &bookkeeping,
                &["failover-sections", "shared", "2", "count"],
                false,
            )
        })
        .collect();
    for worker in &mut sections {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }

    let killed_us = server_time_us(&bookkeeping);
    let killed = Instant::now();
    setup.kill_node(primary);
    // Progress: the first section begun on the new primary. No replica
    // is promoted before the sentinels have found the primary silent for
    // `DOWN_AFTER_MS`: a section that begins sooner took the lock on the
    // old primary, just before the kill (its body goes on meanwhile).
    let promotable_us = killed_us + DOWN_AFTER_MS * 1000;
    let mut starts = Vec::new();
    wait_until_async(
        "a section runs after the kill",
        Duration::from_secs(60),
        || {
            starts = numbers(&bookkeeping, "count:starts");
            starts.last().is_some_and(|last| *last > promotable_us)
        },
    )
    .await;
    let first = starts.iter().find(|start| **start > promotable_us).unwrap();
    let gap = Duration::from_micros(first - killed_us);
    println!("failover gap (SIGKILL of the primary -> first section in a worker process): {gap:?}");

    // The lock the new primary never got, in another process: its holder
    // is told by its next renewal there, within its validity (10 s from
    // its last renewal, before the kill).
    let told = lost_elsewhere.line(LINE_TIMEOUT);
    let told_after = killed.elapsed();
    println!("the other process was told its lock was lost {told_after:?} after the kill");
    assert_eq!(told, "lost Deleted", "told by a renewal on the new primary");
    assert!(told_after < Duration::from_secs(10), "{told_after:?}");

    let new = setup.wait_for_new_primary(primary, 0).unwrap();
    let failed_over = Instant::now();
    assert_eq!(
        get(new, "lock:{lost}"),
        None,
        "the promoted replica never had it"
    );
    assert!(
        get(new, "lock:{a}").is_some(),
        "the promoted replica had it"
    );
    // Fencing tokens: still increasing, from the counter the replica had
    // and past the token it never got (tokens are seeded by the server's
    // clock: one machine, one clock here).
    let after_token = token_of(&fenced).await;
    assert!(
        replicated_token < unreplicated_token && unreplicated_token < after_token,
        "{replicated_token} {unreplicated_token} {after_token}"
    );

    // The lost lock: another holder can take it, and its first holder is
    // told by its next renewal.
    let contender = Lock::new("lost")
        .client(other.clone())
        .try_acquire()
        .await
        .unwrap();
    wait_until_async("the first holder is told", LINE_TIMEOUT, || !lost.is_held()).await;
    assert!(matches!(lost.release().await, Err(LockError::Lost { .. })));
    contender.release().await.unwrap();

    // The kept ones: renewed on the new primary.
    wait_until_async("the kept locks are renewed", LINE_TIMEOUT, || {
        for guard in &kept {
            assert!(
                guard.is_held(),
                "a kept lock was lost: {:?}",
                guard.lost_cause()
            );
        }
        kept.iter().all(|guard| renewed_since(guard, failed_over))
    })
    .await;
    // The waiter, subscribed again on the new primary, is woken there.
    let [a, b] = kept;
    let released = Instant::now();
    a.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();
    println!("waiter woken {:?} after the release", released.elapsed());
    b.release().await.unwrap();
    assert_eq!(one.renewal_stats().lost, 1);
    // The acknowledged one survived (its renewals confirmed again by the
    // new primary's replica).
    acked.send("release");
    assert_eq!(acked.line(LINE_TIMEOUT), "released");

    // The sections: none overlapped another, their tokens kept increasing.
    for worker in &mut sections {
        worker.send("stop");
    }
    for worker in &mut sections {
        let done = worker.line(LINE_TIMEOUT);
        println!("sections: {done}");
        assert!(done.starts_with("done ran="), "{done}");
    }
    let overlaps = redis(&bookkeeping, &["GET", "count:overlaps"]);
    if overlaps != "$-1\r\n" {
        // What to look at when it fails (seen once in CI, on Valkey): a
        // counter of sections inside left above 0 means a body stopped
        // between its INCR and its DECR (every later section then counts
        // as an overlap); each section's start (µs, the bookkeeping
        // server's clock) and token, the kill and the promotion.
        println!(
            "overlaps {overlaps:?}, inside at the end {:?}, killed at {killed_us} µs, promotable at {promotable_us} µs",
            redis(&bookkeeping, &["GET", "count:inside"])
        );
        let (starts, fences) = (
            numbers(&bookkeeping, "count:starts"),
            numbers(&bookkeeping, "count:fences"),
        );
        for (start, fence) in starts.iter().zip(&fences) {
            println!("section start {start} µs, token {fence}");
        }
    }
    assert_eq!(overlaps, "$-1\r\n", "two sections overlapped");
    let fences = numbers(&bookkeeping, "count:fences");
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens went back: {fences:?}"
    );
    let after = numbers(&bookkeeping, "count:starts")
        .into_iter()
        .filter(|start| *start > promotable_us)
        .count();
    println!("{} sections, {after} on the new primary", fences.len());
}

/// `SENTINEL FAILOVER`, over TLS everywhere (`rediss-sentinel://`, the
/// sentinels as a user of theirs, `sentinel_user` and `sentinel_password`,
/// the data nodes as a user of the minimal rule): the old primary is demoted (it would go on taking writes for a
/// moment): the client follows the switch, its lock is kept and renewed on
/// the new primary, and new locks go there. No password is shown, nor in
/// the error of a wrong one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_is_followed_over_tls_with_passwords() {
    let ca = Ca::new("sentinel-ca");
    let setup = secured(Some(TlsOptions::loopback(&ca)), Some("watcher"));
    let url = locker_url(&setup);
    assert!(url.starts_with("rediss-sentinel://"), "{url}");
    assert!(url.contains("sentinel_user=watcher"), "{url}");
    let tls_client = |url: &str| {
        Client::new(
            Config::new(url)
                .tls_root_certificates(ca.certificate_pem())
                .response_timeout(Duration::from_secs(2)),
        )
        .unwrap()
    };
    // A wrong password for the sentinels, then for the data nodes: refused
    // at once (not retried until the call's deadline, 3 s), saying which
    // login to check, naming neither password.
    for (wrong, check) in [
        (
            url.replace("sentinel-secret", "WRONG-sentinel"),
            "check the sentinels' user and password",
        ),
        (
            url.replace("locker-secret", "WRONG-locker"),
            "check the user and password of the data nodes",
        ),
    ] {
        let started = Instant::now();
        let error = Lock::new("job")
            .client(tls_client(&wrong))
            .try_acquire()
            .await
            .unwrap_err();
        let took = started.elapsed();
        let shown = format!("{error} {error:?}");
        assert!(
            !shown.contains("WRONG") && !shown.contains("secret"),
            "{shown}"
        );
        assert!(shown.contains(check), "{shown}");
        assert!(took < Duration::from_secs(2), "took {took:?}: {shown}");
        println!("a wrong password, refused after {took:?}: {error}");
    }
    let client = tls_client(&url);
    let shown = format!("{client:?}");
    assert!(!shown.contains("secret"), "{shown}");

    let primary = setup.primary().unwrap();
    let held = hold(&client, "kept", Duration::from_secs(6)).await;
    setup.wait_until_replicated().unwrap();
    setup.failover().unwrap();
    let new = setup.wait_for_new_primary(primary, 0).unwrap();
    let switched = Instant::now();
    // The old primary may answer a moment more (until a sentinel demotes
    // it): an acquisition that waits is taken on the new one.
    let after = Lock::new("after")
        .wait(Duration::from_secs(30))
        .client(client.clone())
        .acquire()
        .await
        .unwrap();
    let on_new = setup
        .node(new)
        .unwrap()
        .command(&["GET", "lock:{after}"])
        .unwrap();
    assert!(value(&on_new).is_some(), "on the new primary");
    after.release().await.unwrap();
    wait_until_async("the kept lock is renewed", LINE_TIMEOUT, || {
        assert!(held.is_held(), "lost: {:?}", held.lost_cause());
        renewed_since(&held, switched)
    })
    .await;
    held.release().await.unwrap();
}

/// Every sentinel down: a clear error naming each, within bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_sentinel_down_the_error_names_them() {
    let mut setup = RedisSentinel::start();
    for index in 0..setup.sentinel_ports().len() {
        setup.kill_sentinel(index);
    }
    let client =
        Client::new(Config::new(setup.url("")).response_timeout(Duration::from_secs(2))).unwrap();
    let started = Instant::now();
    let error = Lock::new("job")
        .client(client)
        .try_acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    let text = format!("{error}");
    for port in setup.sentinel_ports() {
        assert!(
            text.contains(&format!("127.0.0.1:{port}")),
            "{port} not named: {text}"
        );
    }
    assert!(took < Duration::from_secs(15), "took {took:?}: {text}");
    println!("all sentinels down: {took:?}: {text}");
}

/// A call already waiting on a stalled primary when the sentinels promote
/// a replica goes to the new primary by itself: at half its deadline it
/// finds that the primary changed (the sentinels' `+switch-master`) and is
/// sent again there. Before, it waited on the stalled node until its
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waiting_on_a_stalled_primary_goes_to_the_promoted_replica() {
    let setup = RedisSentinel::start();
    let old = setup.primary().unwrap();
    // Half the deadline (12.5 s) is far longer than the failover takes
    // (down after 1 s, then the election): the call is still waiting
    // when the new primary is named.
    let response_timeout = Duration::from_secs(24);
    let client = Client::new(
        Config::new(setup.url(""))
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(response_timeout),
    )
    .unwrap();
    // The primary is known, with a connection to it.
    let guard = Lock::new("stalled-call")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();

    signal(setup.node(old).unwrap(), "-STOP");
    let call = tokio::spawn(async move {
        let started = Instant::now();
        let taken = Lock::new("stalled-call").client(client).try_acquire().await;
        (taken, started.elapsed())
    });
    let new = tokio::task::block_in_place(|| setup.wait_for_new_primary(old, 0));
    let (taken, took) = call.await.unwrap();
    signal(setup.node(old).unwrap(), "-CONT");
    let new = new.unwrap();
    let guard = taken.unwrap_or_else(|error| {
        panic!("the call waiting on the stalled primary failed after {took:?}: {error}")
    });
    assert!(
        took < response_timeout,
        "it took {took:?}, not about half of its deadline"
    );
    let on_new = value(&test_support::command(new, &["GET", "lock:{stalled-call}"]).unwrap());
    assert!(on_new.is_some(), "the lock is not on the new primary {new}");
    guard.release().await.unwrap();
}

/// Issue 36, hole 1: an acquisition sent again to the new primary at half
/// its deadline holds a lock whose validity ends no later than its key's
/// expiry on that primary (and on the replicas that would take over). The
/// primary is stopped (SIGSTOP) before a waiting acquire of a free lock
/// (ttl 10 s, response timeout 7 s: a deadline of 8 s, sent again at 4 s);
/// the sentinels fail over, the call goes to the new primary and takes the
/// lock there. Until the holder's validity ends, every sample of the key's
/// expiry on the new primary and its replicas (their `PTTL`) is later than
/// the end of the holder's validity, and another client asking just before
/// that end is refused; the holder's release then finds its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_acquisition_is_valid_no_longer_than_its_key_on_the_new_primary() {
    let setup = RedisSentinel::start();
    let old = setup.primary().unwrap();
    let client = || {
        Client::new(
            Config::new(setup.url(""))
                .connect_timeout(Duration::from_secs(1))
                .response_timeout(Duration::from_secs(7)),
        )
        .unwrap()
    };
    let (holder, other) = (client(), client());
    for client in [&holder, &other] {
        Lock::new("warm")
            .client(client.clone())
            .try_acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let ttl = Duration::from_secs(10);
    signal(setup.node(old).unwrap(), "-STOP");
    let started = Instant::now();
    let taken = Lock::new("resent")
        .ttl(ttl)
        .wait(Duration::from_secs(15))
        .client(holder.clone())
        .acquire()
        .await;
    let took = started.elapsed();
    let guard = taken.unwrap_or_else(|error| {
        signal(setup.node(old).unwrap(), "-CONT");
        panic!("the acquisition failed after {took:?}: {error}")
    });
    // The node that took the lock is the new primary (asked directly: the
    // setup's helpers would also ask the stopped node, which does not
    // answer).
    let live: Vec<u16> = setup
        .node_ports()
        .iter()
        .copied()
        .filter(|&port| port != old)
        .collect();
    let is_primary = |port: u16| {
        test_support::command(port, &["ROLE"]).is_ok_and(|role| role.contains("master"))
    };
    let new = live.iter().copied().find(|&port| is_primary(port));
    let Some(new) = new else {
        signal(setup.node(old).unwrap(), "-CONT");
        panic!("no node but the stopped one is a primary: {live:?}")
    };
    // Sent again at half the deadline (4 s), not answered by the old one.
    assert!(
        took >= Duration::from_millis(3900),
        "taken after {took:?}: not by the call sent again"
    );
    let pttl = |port: u16| -> Option<Duration> {
        let reply = test_support::command(port, &["PTTL", "lock:{resent}"]).ok()?;
        let ms: i64 = value(&reply)?.parse().ok()?;
        u64::try_from(ms).ok().map(Duration::from_millis)
    };
    let replicates = |port: u16, primary: u16| {
        test_support::command(port, &["INFO", "replication"]).is_ok_and(|info| {
            info.contains(&format!("master_port:{primary}\r\n"))
                && info.contains("master_link_status:up")
        })
    };
    let mut samples = Vec::new();
    let mut replicas_seen = false;
    loop {
        let remaining = guard.remaining();
        if remaining < Duration::from_millis(300) {
            break;
        }
        // The new primary and its replicas (the stopped node is not asked:
        // it would not answer).
        let mut ports = vec![new];
        let replicas: Vec<u16> = live
            .iter()
            .copied()
            .filter(|&port| port != new && replicates(port, new))
            .collect();
        replicas_seen |= !replicas.is_empty();
        ports.extend(replicas);
        for port in ports {
            // Read after `now`: the key lives at least until now + its PTTL.
            let now = Instant::now();
            let remaining = guard.remaining();
            let valid_until = now + remaining;
            let left = pttl(port);
            samples.push((now - started, port, left, remaining));
            let expires = left.map(|left| now + left);
            assert!(
                expires.is_some_and(|expires| expires >= valid_until),
                "node {port} (new primary {new}): the key expires {:?} after the holder's \
                 validity ends (samples since the start: {samples:?})",
                expires.map(|expires| expires.checked_duration_since(valid_until))
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(replicas_seen, "no replica followed the new primary {new}");
    // Just before the holder's validity ends, the lock is still taken.
    let refused = Lock::new("resent")
        .client(other.clone())
        .try_acquire()
        .await;
    assert!(
        matches!(&refused, Err(error) if error.is_busy()),
        "another client asking {:?} before the holder's validity ended: {refused:?}",
        guard.remaining()
    );
    guard.release().await.unwrap();
    signal(setup.node(old).unwrap(), "-CONT");
    eprintln!(
        "taken after {took:?}; samples (since start, node, PTTL, holder's remaining): {samples:?}"
    );
}
