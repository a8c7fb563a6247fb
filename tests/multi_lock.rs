//! Several keys at once (`Lock::all`, `key = [..]`) on one Redis server: all
//! or nothing, waiting woken by any release, renewal and loss of the whole
//! set, fencing, reentrancy both ways, cancellation at every await.

mod common;
use common::*;
use std::time::Duration;

use futures_util::FutureExt;
use lock_runtime::{Client, Config, ConfigError, Lock, LockError, LostCause};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

fn get(server: &RedisServer, key: &str) -> Option<String> {
    value(&redis(server, &["GET", key]))
}

fn exists(server: &RedisServer, key: &str) -> bool {
    redis(server, &["EXISTS", key]) == ":1\r\n"
}

#[tokio::test]
async fn a_set_is_taken_whole_or_not_at_all() {
    let server = RedisServer::start();
    let client = client(&server);
    // Given in any order, with a duplicate: one lock per name, sorted.
    let set = Lock::all(["b", "a", "b"])
        .ttl(Duration::from_secs(10))
        .client(client.clone());
    assert_eq!(set.names(), ["a", "b"]);
    let guard = set.try_acquire().await.unwrap();
    let tokens: Vec<_> = guard.locks().map(|lock| lock.token().to_owned()).collect();
    assert_eq!(tokens.len(), 2);
    assert_eq!(
        get(&server, "lock:{a}").as_deref(),
        Some(tokens[0].as_str())
    );
    assert_eq!(
        get(&server, "lock:{b}").as_deref(),
        Some(tokens[1].as_str())
    );
    // Each key is an ordinary lock: a single lock of it is busy.
    let single = Lock::new("b").client(client.clone());
    assert!(single.try_acquire().await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    assert!(!exists(&server, "lock:{a}") && !exists(&server, "lock:{b}"));

    // One key held: the set takes none, and says which is busy.
    let b = single.try_acquire().await.unwrap();
    let busy = set.try_acquire().await.unwrap_err();
    assert!(
        matches!(&busy, LockError::Busy { name } if name == "b"),
        "{busy:?}"
    );
    assert!(!exists(&server, "lock:{a}"), "a was taken without b");
    b.release().await.unwrap();

    // `from == to`: one lock, not a self-deadlock.
    let same = Lock::all(["account:7", "account:7"])
        .wait(Duration::from_secs(1))
        .client(client.clone());
    let guard = tokio::time::timeout(Duration::from_secs(5), same.acquire())
        .await
        .expect("a set naming one key twice must not wait for itself")
        .unwrap();
    assert_eq!(guard.locks().count(), 1);
    guard.release().await.unwrap();

    // An empty set is a configuration error.
    let empty = Lock::all(Vec::<String>::new()).client(client);
    assert!(matches!(
        empty.try_acquire().await.unwrap_err(),
        LockError::Config(ConfigError::InvalidName { .. })
    ));
}

#[tokio::test]
async fn one_script_call_takes_the_set() {
    let server = RedisServer::start();
    let client = client(&server);
    let set = Lock::all(["x", "y", "z"]).client(client);
    // Warm: the script is loaded.
    set.try_acquire().await.unwrap().release().await.unwrap();
    let (evalsha, set_calls) = (
        command_calls(&server, "evalsha"),
        command_calls(&server, "set"),
    );
    let guard = set.try_acquire().await.unwrap();
    assert_eq!(command_calls(&server, "evalsha") - evalsha, 1);
    // Three keys set, by the one script.
    assert_eq!(command_calls(&server, "set") - set_calls, 3);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_is_woken_by_the_release_of_any_of_its_keys() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_secs(30);
    let x = Lock::new("x").ttl(ttl).client(client.clone());
    let y = Lock::new("y").ttl(ttl).client(client.clone());
    let (held_x, held_y) = (
        x.try_acquire().await.unwrap(),
        y.try_acquire().await.unwrap(),
    );
    let set = Lock::all(["y", "x"])
        .ttl(ttl)
        .wait(Duration::from_secs(20))
        .client(client.clone());
    let waiter = tokio::spawn(async move {
        let guard = set.acquire().await?;
        let names: Vec<String> = guard.locks().map(|lock| lock.name().to_owned()).collect();
        guard.release().await?;
        Ok::<_, LockError>(names)
    });
    // It stands in both queues, and both holders' wake marks name it.
    wait_until_async(
        "the set waiter is queued behind x and y",
        LINE_TIMEOUT,
        || {
            ["lock:{x}", "lock:{y}"].iter().all(|key| {
                get(&server, key).is_some_and(|value| value.ends_with('*') && value.contains('|'))
            })
        },
    )
    .await;
    let published = command_calls(&server, "publish");
    held_x.release().await.unwrap();
    // Woken by x's release (one message), it finds y still held and waits on.
    assert_eq!(command_calls(&server, "publish") - published, 1);
    assert!(!waiter.is_finished());
    held_y.release().await.unwrap();
    assert_eq!(command_calls(&server, "publish") - published, 2);
    let names = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(names, ["x", "y"]);
    // Nothing left: no lock, no queue.
    wait_until_async("no key is left", LINE_TIMEOUT, || {
        value(&redis(&server, &["DBSIZE"])).as_deref() == Some("0")
    })
    .await;
}

#[tokio::test]
async fn renewal_renews_the_set_together_and_a_lost_key_stops_the_body() {
    let server = RedisServer::start();
    let client = client(&server);
    // A 3 s ttl, renewed about every second: on a loaded machine a renewal
    // may take longer than a 300 ms (or 1 s) ttl allows.
    let set = Lock::all(["r1", "r2", "r3"])
        .ttl(Duration::from_secs(3))
        .renew()
        .client(client.clone());
    let before = client.renewal_stats();
    let output = set
        .run(async {
            tokio::time::sleep(Duration::from_millis(4_500)).await;
            7
        })
        .await
        .unwrap();
    assert_eq!(output, 7);
    let after = client.renewal_stats();
    let (sent, trips) = (
        after.renewals_sent - before.renewals_sent,
        after.round_trips - before.round_trips,
    );
    // Every round trip renewed the three keys together.
    assert!(trips >= 2, "{trips} round trips");
    assert_eq!(sent, 3 * trips, "{sent} renewals in {trips} round trips");

    // A key of the set deleted: the body is stopped, and the error names it.
    let server_ref = &server;
    let result = set
        .run(async {
            redis(server_ref, &["DEL", "lock:{r2}"]);
            tokio::time::sleep(Duration::from_secs(10)).await;
        })
        .await;
    match result {
        Err(LockError::Lost { name, cause }) => {
            assert_eq!(name, "r2");
            assert_eq!(cause, LostCause::Deleted);
        }
        other => panic!("{other:?}"),
    }
    wait_until_async("the rest of the set is released", LINE_TIMEOUT, || {
        !exists(&server, "lock:{r1}") && !exists(&server, "lock:{r3}")
    })
    .await;
}

#[tokio::test]
async fn one_fencing_token_for_the_set_larger_than_every_earlier_one() {
    let server = RedisServer::start();
    let client = client(&server);
    let fenced = |name: &str| Lock::new(name).fencing().client(client.clone());
    // Tokens of x pushed far ahead of y's.
    redis(
        &server,
        &["SET", "lock:{fx}:fence", "9000000000000000", "PX", "60000"],
    );
    let y_token = {
        let guard = fenced("fy").try_acquire().await.unwrap();
        let token = guard.fencing_token().unwrap();
        guard.release().await.unwrap();
        token
    };
    let guard = Lock::all(["fx", "fy"])
        .fencing()
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    let token = guard.fencing_token().unwrap();
    assert!(token > 9_000_000_000_000_000 && token > y_token, "{token}");
    // Every lock of the set carries it.
    assert!(guard
        .locks()
        .all(|lock| lock.fencing_token() == Some(token)));
    guard.release().await.unwrap();
    // And every later token of each key is larger.
    for name in ["fx", "fy"] {
        let guard = fenced(name).try_acquire().await.unwrap();
        assert!(guard.fencing_token().unwrap() > token, "{name}");
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn reentrancy_both_ways_never_deadlocks() {
    let server = RedisServer::start();
    let client = client(&server);
    let wait = Duration::from_secs(2);
    let one = Lock::new("account:1").wait(wait).client(client.clone());
    let pair = Lock::all(["account:1", "account:2"])
        .wait(wait)
        .client(client.clone());

    // Holding account:1, a body locks [account:1, account:2]: account:1 is
    // shared (reentrant), account:2 taken.
    let inner = tokio::time::timeout(
        Duration::from_secs(10),
        one.run(async {
            let guard = pair.acquire().await.unwrap();
            let names: Vec<String> = guard.locks().map(|lock| lock.name().to_owned()).collect();
            assert!(exists(&server, "lock:{account:2}"));
            guard.release().await.unwrap();
            // account:1 is still held by the outer body.
            assert!(exists(&server, "lock:{account:1}"));
            names
        }),
    )
    .await
    .expect("no self-deadlock")
    .unwrap();
    assert_eq!(inner, ["account:1", "account:2"]);
    assert!(!exists(&server, "lock:{account:1}"));

    // The reverse: a body under the set locks account:1 alone.
    let reentered = tokio::time::timeout(
        Duration::from_secs(10),
        pair.run(async {
            let guard = one.acquire().await.unwrap();
            let reentrant = guard.is_reentrant();
            guard.release().await.unwrap();
            // And the whole set again, inside itself.
            let again = pair.acquire().await.unwrap();
            let all = again.is_reentrant();
            again.release().await.unwrap();
            (reentrant, all)
        }),
    )
    .await
    .expect("no self-deadlock")
    .unwrap();
    assert_eq!(reentered, (true, true));
    assert!(!exists(&server, "lock:{account:1}") && !exists(&server, "lock:{account:2}"));

    // With `fencing`, a set cannot share one of its keys: a clear error.
    let fenced_one = Lock::new("account:1").fencing().client(client.clone());
    let fenced_pair = Lock::all(["account:1", "account:2"])
        .fencing()
        .client(client.clone());
    let error = fenced_one
        .run(async { fenced_pair.try_acquire().await.unwrap_err() })
        .await
        .unwrap();
    assert!(
        matches!(&error, LockError::Config(ConfigError::Reentry { name, .. }) if name == "account:1"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_dropped_acquisition_leaves_nothing_behind() {
    let server = RedisServer::start();
    let client = client(&server);
    let held = Lock::new("c2")
        .ttl(Duration::from_secs(30))
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    // A ttl longer than every bound here: a lock left behind would still be
    // there when the test looks.
    let set = Lock::all(["c1", "c2"])
        .ttl(Duration::from_secs(120))
        .wait(Duration::from_secs(30))
        .client(client.clone());
    // Dropped while waiting: its places in both queues are given up.
    {
        let mut acquiring = Box::pin(set.acquire());
        let queued = async {
            wait_until_async("the waiter is queued", LINE_TIMEOUT, || {
                exists(&server, "lock:{c1}:queue") && exists(&server, "lock:{c2}:queue")
            })
            .await
        };
        tokio::select! {
            _ = &mut acquiring => panic!("c2 is held"),
            () = queued => {}
        }
    }
    // Left by LEAVE (not expired): the holder's wake mark no longer names it.
    wait_until_async("the queues are left", LINE_TIMEOUT, || {
        !exists(&server, "lock:{c1}:queue")
            && !exists(&server, "lock:{c2}:queue")
            && get(&server, "lock:{c2}").as_deref() == Some(held.token())
    })
    .await;
    assert!(!exists(&server, "lock:{c1}"));
    held.release().await.unwrap();

    // Dropped with its attempt on the wire: through a proxy that delays
    // every reply by 300 ms, dropped once Redis ran the script (both keys
    // set) and before the reply came back. Its token is released in the
    // background.
    let proxy = test_support::Proxy::start(server.port());
    let slow = set
        .clone()
        .client(Client::new(Config::new(proxy.url())).unwrap());
    // Its connection opened first: on a loaded machine a fresh client's
    // first call may run out its 2 s (then its attempt is released in the
    // background, and the set is busy until it is).
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    loop {
        match slow.try_acquire().await {
            Ok(guard) => break guard.release().await.unwrap(),
            Err(LockError::Redis { .. } | LockError::Busy { .. })
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("{error:?}"),
        }
    }
    proxy.set_latency(Duration::from_millis(300));
    {
        let mut acquiring = Box::pin(slow.acquire());
        let taken = async {
            wait_until_async("the script ran", LINE_TIMEOUT, || {
                exists(&server, "lock:{c1}") && exists(&server, "lock:{c2}")
            })
            .await
        };
        tokio::select! {
            _ = &mut acquiring => panic!("the reply is delayed past the script's run"),
            () = taken => {}
        }
    }
    wait_until_async("the set is free again", LINE_TIMEOUT, || {
        !exists(&server, "lock:{c1}") && !exists(&server, "lock:{c2}")
    })
    .await;

    // Dropped at its first polls, before or as the attempt is sent.
    for polls in 0..3 {
        let mut acquiring = Box::pin(set.acquire());
        for _ in 0..polls {
            let _ = (&mut acquiring).now_or_never();
        }
        drop(acquiring);
        wait_until_async("the set is free again", LINE_TIMEOUT, || {
            !exists(&server, "lock:{c1}") && !exists(&server, "lock:{c2}")
        })
        .await;
    }

    // A body dropped mid-run: every lock released.
    let run = set.run(std::future::pending::<()>());
    let mut run = Box::pin(run);
    wait_until_async("the set is held", LINE_TIMEOUT, || {
        let _ = (&mut run).now_or_never();
        exists(&server, "lock:{c1}") && exists(&server, "lock:{c2}")
    })
    .await;
    drop(run);
    wait_until_async("the set is released", LINE_TIMEOUT, || {
        !exists(&server, "lock:{c1}") && !exists(&server, "lock:{c2}")
    })
    .await;
}

/// Parses `done a=1 b=2|first error` into the values of its fields.
fn fields(line: &str) -> std::collections::HashMap<String, u64> {
    let (head, _) = line.split_once('|').unwrap_or((line, ""));
    head.split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.parse().unwrap()))
        .collect()
}

#[test]
fn two_processes_locking_x_y_and_y_x_never_deadlock_nor_overlap() {
    let server = RedisServer::start();
    let rounds = 1_000;
    let mut workers = [
        worker(&server, &["multi-rounds", "1000", "1", "x", "y"]),
        worker(&server, &["multi-rounds", "1000", "1", "y", "x"]),
    ];
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    for worker in &mut workers {
        worker.send("go");
    }
    // A deadlock would show as a wait running out (60 s each): errors.
    for worker in &mut workers {
        let line = worker.line(Duration::from_secs(600));
        let done = fields(&line);
        assert!(line.starts_with("done"), "{line}");
        assert_eq!(done["rounds"], rounds, "{line}");
        assert_eq!(done["errors"], 0, "{line}");
        assert!(done["longest_ms"] < 30_000, "{line}");
    }
    assert_eq!(value(&redis(&server, &["GET", "multi:overlaps"])), None);
    // Both made progress, interleaved: each ran sections between the
    // other's.
    let order = redis(&server, &["LRANGE", "multi:order", "0", "-1"]);
    let pids: Vec<&str> = order
        .lines()
        .filter(|line| !line.starts_with('*') && !line.starts_with('$'))
        .collect();
    assert_eq!(pids.len() as u64, 2 * rounds);
    let switches = pids.windows(2).filter(|pair| pair[0] != pair[1]).count();
    assert!(
        switches >= 10,
        "{switches} switches between the two processes"
    );
}

#[test]
fn transfers_from_several_processes_keep_the_total() {
    let server = RedisServer::start();
    let accounts = 6;
    for account in 0..accounts {
        redis(&server, &["SET", &format!("balance:{account}"), "1000"]);
    }
    let mut workers: Vec<Process> = (0..3)
        .map(|seed| {
            let seed = (seed + 1).to_string();
            worker(&server, &["transfer", "6", "300", &seed])
        })
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    for worker in &mut workers {
        worker.send("go");
    }
    for worker in &mut workers {
        let line = worker.line(Duration::from_secs(600));
        let done = fields(&line);
        assert_eq!((done["transfers"], done["errors"]), (300, 0), "{line}");
    }
    let total: i64 = (0..accounts)
        .map(|account| {
            value(&redis(&server, &["GET", &format!("balance:{account}")]))
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 1000 * accounts);
}

/// The most sections of single-key lockers of x that ran between a set
/// [x, y] asking and getting the set, over ten asks: `clients` clients of
/// `tasks` tasks each take x in turn as fast as they can (2 ms sections),
/// each asking again as soon as it released, so x is never free for long
/// and always wanted by a queued waiter.
async fn sections_ahead_of_a_set(server: &RedisServer, clients: usize, tasks: usize) -> u64 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let sections = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut stream = Vec::new();
    for _ in 0..clients {
        let client = client(server);
        for _ in 0..tasks {
            let lock = Lock::new("x")
                .ttl(Duration::from_secs(10))
                .wait(Duration::from_secs(30))
                .client(client.clone());
            let (sections, stop) = (Arc::clone(&sections), Arc::clone(&stop));
            stream.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.acquire().await.unwrap();
                    // The section's work.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    sections.fetch_add(1, Ordering::Relaxed);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    wait_until_async("the stream is running", LINE_TIMEOUT, || {
        sections.load(Ordering::Relaxed) >= 30
    })
    .await;
    let set = Lock::all(["x", "y"])
        .ttl(Duration::from_secs(10))
        .wait(Duration::from_secs(20))
        .client(client(server));
    // A first ask opens the set's subscription (a release it misses while
    // it subscribes is one more section): not counted.
    set.acquire().await.unwrap().release().await.unwrap();
    let mut worst = 0;
    for _ in 0..10 {
        let before = sections.load(Ordering::Relaxed);
        let guard = set.acquire().await.unwrap();
        let ran = sections.load(Ordering::Relaxed) - before;
        worst = worst.max(ran);
        guard.release().await.unwrap();
        // Let the stream run a few sections between the set's turns.
        let now = sections.load(Ordering::Relaxed);
        wait_until_async("the stream goes on", LINE_TIMEOUT, || {
            sections.load(Ordering::Relaxed) >= now + 3
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in stream {
        task.await.unwrap();
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_single_key_lockers_does_not_starve_a_set() {
    let server = RedisServer::start();
    // Three clients: woken by the release that makes it first in x's line,
    // the set gets x after the sections of the waiters queued ahead of it
    // (at most the three of them: the one whose section was ending as the
    // set asked may queue again first) and the one under way (design §16).
    let worst = sections_ahead_of_a_set(&server, 3, 1).await;
    println!("three clients: at most {worst} sections ahead of the set");
    assert!(
        worst <= 4,
        "{worst} single-key sections ran ahead of the set"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_releaser_lets_a_waiting_set_go_first() {
    let server = RedisServer::start();
    // One client taking x in a loop: its release wakes the set, and its next
    // attempt lets it go first (design §4), as it does a single waiter. At
    // most the section ending as the set asked and one begun before the
    // set's place marked x ran ahead of it (design §16).
    let worst = sections_ahead_of_a_set(&server, 1, 1).await;
    println!("one task: at most {worst} sections ahead of the set");
    assert!(
        worst <= 2,
        "{worst} single-key sections ran ahead of the set"
    );
    // Three tasks of one client pass x among themselves in the process (a
    // cohort): at most 4 passes in a row while the set waits in Redis, then
    // a release through Redis wakes it (§4); with the two sections above and
    // the cohort's representative, which may be queued ahead of it, 7.
    redis(&server, &["FLUSHALL"]);
    let worst = sections_ahead_of_a_set(&server, 1, 3).await;
    println!("three tasks: at most {worst} sections ahead of the set");
    assert!(
        worst <= 7,
        "{worst} single-key sections ran ahead of the set"
    );
}

#[tokio::test]
async fn each_lock_of_a_set_shows_in_lock_info_with_its_holder() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = Lock::all(["shown:a", "shown:b"])
        .caller("bank::transfer")
        .client(client.clone())
        .try_acquire()
        .await
        .unwrap();
    // The holder record is written once a hold has lasted a second.
    for name in ["shown:a", "shown:b"] {
        let mut function = None;
        let deadline = std::time::Instant::now() + LINE_TIMEOUT;
        while function.is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "no holder record for {name}"
            );
            let info = client.lock_info(name).await.unwrap();
            let holder = info
                .iter()
                .flat_map(|lock| lock.holders.iter())
                .next()
                .unwrap_or_else(|| panic!("{name} shows no holder: {info:?}"));
            function = holder
                .record
                .as_ref()
                .and_then(|record| record.function.clone());
            if function.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert_eq!(function.as_deref(), Some("bank::transfer"));
    }
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_set_waiting_in_a_queue_keeps_no_key_from_a_fair_locker() {
    let server = RedisServer::start();
    let client = client(&server);
    // A holder of x (fair), and a set [x, y] waiting for x: first in y's
    // queue too, while y is free.
    let x = Lock::new("x").fair().client(client.clone());
    let held_x = x.try_acquire().await.unwrap();
    let set = Lock::all(["x", "y"])
        .fair()
        .wait(Duration::from_secs(30))
        .client(client.clone());
    let waiting = tokio::spawn(async move {
        let guard = set.acquire().await?;
        guard.release().await
    });
    wait_until_async("the set is first in y's queue", LINE_TIMEOUT, || {
        value(&redis(&server, &["LINDEX", "lock:{y}:queue", "0"]))
            .is_some_and(|entry| entry.ends_with('*'))
    })
    .await;
    // x's holder now takes y (fair, waiting): the set's place in y's queue
    // must not make it wait, or it would wait for a set that waits for x.
    let y = Lock::new("y")
        .fair()
        .wait(Duration::from_secs(5))
        .client(client.clone());
    let held_y = y.acquire().await.expect("a set's queue place keeps no key");
    held_y.release().await.unwrap();
    held_x.release().await.unwrap();
    tokio::time::timeout(LINE_TIMEOUT, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_fair_set_does_not_pass_a_single_waiter_queued_behind_another_set() {
    let server = RedisServer::start();
    let client = client(&server);
    // x is free; in its queue another set's waiter, then a single-key
    // waiter W, both live: the state two waiters leave when neither has
    // tried since x was released (W's process stopped, say).
    let now_ms: u64 = {
        let time = redis(&server, &["TIME"]);
        let seconds: u64 = time.split("\r\n").nth(2).unwrap().parse().unwrap();
        seconds * 1000
    };
    let deadline = (now_ms + 60_000).to_string();
    for entry in [
        "lock-waiters:other|set-token*",
        "lock-waiters:other|w-token",
    ] {
        redis(&server, &["RPUSH", "lock:{x}:queue", entry]);
        redis(&server, &["ZADD", "lock:{x}:waiters", &deadline, entry]);
    }
    // A fair single lock lets W go first (a set's place keeps no key).
    let single = Lock::new("x").fair().client(client.clone());
    assert!(matches!(
        single.try_acquire().await.unwrap_err(),
        LockError::Busy { .. }
    ));
    // So does a fair set: W is the first single-key waiter in x's queue.
    let set = Lock::all(["x", "y"]).fair().client(client.clone());
    assert!(matches!(
        set.try_acquire().await.unwrap_err(),
        LockError::Busy { name } if name == "x"
    ));
    assert!(!exists(&server, "lock:{x}") && !exists(&server, "lock:{y}"));
    // Once W is gone, the fair set passes the other set's place.
    redis(
        &server,
        &["LREM", "lock:{x}:queue", "0", "lock-waiters:other|w-token"],
    );
    set.try_acquire().await.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_set_held_by_outer_locks_gets_a_token_above_each_keys_and_raises_it() {
    let server = RedisServer::start();
    let client = client(&server);
    let fenced = |name: &str| Lock::new(name).fencing().client(client.clone());
    // y's tokens far ahead of x's (another primary's clock, a fence raised
    // by an earlier set, a quorum's maximum).
    redis(
        &server,
        &["SET", "lock:{hy}:fence", "9000000000000000", "PX", "60000"],
    );
    let set = Lock::all(["hx", "hy"]).fencing().client(client.clone());
    let (x_token, set_token, x_after) = fenced("hx")
        .run(async {
            let x_token = lock_runtime::current().unwrap().fencing_token().unwrap();
            let set_token = fenced("hy")
                .run(async {
                    let guard = set.try_acquire().await.unwrap();
                    assert!(guard.is_reentrant());
                    let set_token = guard.fencing_token().unwrap();
                    assert!(guard
                        .locks()
                        .all(|lock| lock.fencing_token() == Some(set_token)));
                    guard.release().await.unwrap();
                    set_token
                })
                .await
                .unwrap();
            // The outer x's holder writes with the set's token from now on.
            let x_after = lock_runtime::current().unwrap().fencing_token().unwrap();
            (x_token, set_token, x_after)
        })
        .await
        .unwrap();
    assert!(set_token > 9_000_000_000_000_000, "{set_token}");
    assert!(x_token < set_token && x_after == set_token);
    // The next token of each key is larger than the set's, x's too.
    for name in ["hx", "hy"] {
        let guard = fenced(name).try_acquire().await.unwrap();
        let next = guard.fencing_token().unwrap();
        assert!(
            next > set_token,
            "{name}: {next} after the set's {set_token}"
        );
        guard.release().await.unwrap();
    }
}
