//! In-process hand-off: tasks of one client waiting for one key queue in
//! the process and get the lock passed on with one script, each with its
//! own token, ttl, renewal and fencing token, without starving waiters of
//! other clients.

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_runtime::{Client, Config, Lock, LockError};

fn client(server: &RedisServer) -> Client {
    Client::new(Config::new(server.url())).unwrap()
}

/// Script calls Redis ran so far (EVALSHA and EVAL).
fn script_calls(server: &RedisServer) -> u64 {
    let stats = redis(server, &["INFO", "commandstats"]);
    ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
        .iter()
        .filter_map(|field| {
            let at = stats.find(field)? + field.len();
            stats[at..].split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The pub/sub channel `client`'s waiters are woken on (the first part of
/// its queue entries `<channel>|<token>`): learnt by making it wait once in
/// Redis behind another client's lock on a key of its own.
async fn waiter_channel(server: &RedisServer, client: &Client) -> String {
    let probe = "channel-probe";
    let holder = Lock::new(probe)
        .client(self::client(server))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(client, probe, LINE_TIMEOUT);
    let queue = format!("lock:{{{probe}}}:queue");
    wait_until_async("the probe waiter queued", LINE_TIMEOUT, || {
        redis(server, &["LLEN", &queue]) == ":1\r\n"
    })
    .await;
    let entry = value(&redis(server, &["LINDEX", &queue, "0"])).unwrap();
    holder.release().await.unwrap();
    waited(waiter).await.release().await.unwrap();
    entry.split('|').next().unwrap().to_owned()
}

/// Whether a waiter woken on `channel` is queued in Redis for `key`.
fn queued_on(server: &RedisServer, key: &str, channel: &str) -> bool {
    redis(
        server,
        &["LRANGE", &format!("lock:{{{key}}}:queue"), "0", "-1"],
    )
    .contains(&format!("\r\n{channel}|"))
}

/// 8 tasks of one client take turns 200 times on one key: no update lost,
/// one script call per section (the hand-off), at most one of them queued
/// in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_pass_the_lock_in_the_process() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("hot")
        .wait(Duration::from_secs(30))
        .client(client);
    let (counter, inside, most) = (
        Arc::new(Mutex::new(0u64)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let claimed = Arc::new(AtomicUsize::new(0));
    const SECTIONS: usize = 200;
    let scripts_before = script_calls(&server);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (lock, counter, inside, most, claimed) = (
            lock.clone(),
            Arc::clone(&counter),
            Arc::clone(&inside),
            Arc::clone(&most),
            Arc::clone(&claimed),
        );
        tasks.push(tokio::spawn(async move {
            while claimed.fetch_add(1, Ordering::SeqCst) < SECTIONS {
                lock.run(async {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let read = *counter.lock().unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    *counter.lock().unwrap() = read + 1;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap();
            }
        }));
    }
    let mut queued_in_redis = 0;
    while !tasks.iter().all(|task| task.is_finished()) {
        queued_in_redis = queued_in_redis.max(
            value(&redis(&server, &["LLEN", "lock:{hot}:queue"]))
                .unwrap()
                .parse::<u32>()
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*counter.lock().unwrap(), SECTIONS as u64);
    assert_eq!(most.load(Ordering::SeqCst), 1, "two tasks inside at once");
    // At most its representative (while the first holder, which took the
    // free lock with a plain SET NX, is in no cohort).
    assert!(
        queued_in_redis <= 1,
        "{queued_in_redis} tasks of one client queued in Redis"
    );
    let scripts = script_calls(&server) - scripts_before;
    assert!(
        scripts <= SECTIONS as u64 + 10,
        "{scripts} script calls for {SECTIONS} sections"
    );
    assert_eq!(redis(&server, &["DBSIZE"]), ":0\r\n");
}

/// Every holder, passed the lock in the process or not, gets a fencing
/// token larger than all earlier ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_local_passes() {
    let server = RedisServer::start();
    let lock = Lock::new("fenced")
        .fencing()
        .wait(Duration::from_secs(30))
        .client(client(&server));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (lock, tokens) = (lock.clone(), Arc::clone(&tokens));
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = lock.acquire().await.unwrap();
                tokens.lock().unwrap().push(guard.fencing_token().unwrap());
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 100);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "fencing tokens not increasing: {tokens:?}"
    );
}

/// While a waiter of another client is queued in Redis, the lock is passed
/// in the process at most 4 times in a row: the other client gets it within
/// a few sections, not after the busy process is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_other_clients_are_not_starved() {
    let server = RedisServer::start();
    let other_client = client(&server);
    let other_channel = waiter_channel(&server, &other_client).await;
    let busy = Lock::new("shared")
        .wait(Duration::from_secs(30))
        .client(client(&server));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sections = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (lock, stop, sections) = (busy.clone(), Arc::clone(&stop), Arc::clone(&sections));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                lock.run(async {
                    sections.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await
                })
                .await
                .unwrap();
            }
        }));
    }
    wait_until_async("the busy tasks pass the lock around", LINE_TIMEOUT, || {
        sections.load(Ordering::SeqCst) >= 20
    })
    .await;
    let other = spawn_waiter(&other_client, "shared", Duration::from_secs(20));
    wait_until_async("the other client is queued in Redis", LINE_TIMEOUT, || {
        queued_on(&server, "shared", &other_channel)
    })
    .await;
    let queued_at = Instant::now();
    let before = sections.load(Ordering::SeqCst);
    let guard = waited(other).await;
    let ran = sections.load(Ordering::SeqCst) - before;
    let waited = queued_at.elapsed();
    guard.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    // Once it is queued: the section running then, at most 4 local passes
    // (one more may have been decided before its mark was seen), then the
    // hand-over; a busy process that ignored it would go on for as long as
    // its tasks run.
    assert!(
        ran <= 6,
        "{ran} local sections started while the other client was queued"
    );
    assert!(
        waited < Duration::from_secs(5),
        "the other client waited {waited:?} for a few 5 ms sections"
    );
}

/// A local waiter that gives up (its wait over, or cancelled) leaves the
/// queue: the holder's release frees the lock, nothing is left behind, and
/// the next acquire is immediate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_that_gives_up_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("gives-up").client(client.clone());
    let waiting = lock.clone().wait(Duration::from_secs(30));
    let holder = waiting.acquire().await.unwrap();
    let short = lock.clone().wait(Duration::from_millis(50));
    let asked = Instant::now();
    match short.acquire().await {
        Err(LockError::WaitTimeout { .. }) => {}
        other => panic!("expected a wait timeout, got {other:?}"),
    }
    // Its 50 ms wait, with slack for a loaded machine (the holder holds it
    // for as long as the test wants: a waiter that ignored its wait would
    // not be back at all).
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let cancelled = tokio::time::timeout(Duration::from_millis(50), waiting.acquire()).await;
    assert!(cancelled.is_err(), "the holder still holds it");
    holder.release().await.unwrap();
    wait_until_async("the lock is free", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{gives-up}"]) == ":0\r\n"
    })
    .await;
    let again = waiting.acquire().await.unwrap();
    again.release().await.unwrap();
    assert_eq!(redis(&server, &["DBSIZE"]), ":0\r\n");
}

/// A hold passed in the process has its own ttl (the waiter's, not the
/// passer's) and its own renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_hold_has_its_own_ttl_and_renewal() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = cohort_holder(&server, &client, "own", Duration::from_secs(30)).await;
    let waiter = tokio::spawn({
        let lock = Lock::new("own")
            .ttl(Duration::from_millis(900))
            .renew()
            .wait(Duration::from_secs(30))
            .client(client.clone());
        let client = client.clone();
        async move {
            let guard = lock.acquire().await.unwrap();
            let token = guard.token().to_owned();
            // Past its ttl: renewed every 300 ms (the first holder is not
            // renewed, so these are its renewals).
            wait_until_async("the passed hold was renewed 4 times", LINE_TIMEOUT, || {
                client.renewal_stats().renewals_sent >= 4
            })
            .await;
            (guard, token)
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("own") == 1
    })
    .await;
    let first = holder.token().to_owned();
    holder.release().await.unwrap();
    let pttl: i64 = value(&redis(&server, &["PTTL", "lock:{own}"]))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (0..=900).contains(&pttl),
        "the passed hold has the waiter's 900 ms ttl, not 30 s: {pttl}"
    );
    let (guard, token) = waiter.await.unwrap();
    assert_ne!(token, first, "a passed hold has its own token");
    assert!(guard.is_held(), "renewed past its ttl");
    assert_eq!(
        value(&redis(&server, &["GET", "lock:{own}"])).as_deref(),
        Some(token.as_str())
    );
    guard.release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{own}"]), ":0\r\n");
}

/// 8 tasks of one client holding 20 ms each, back to back: a waiter of
/// another client gets the lock within a few of their sections, every time
/// (the bound holds across the cohort's release: its waiters stay queued
/// until the release is done, then queue behind the woken waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_starvation_bound_holds_for_long_sections() {
    let server = RedisServer::start();
    let other_client = client(&server);
    let other_channel = waiter_channel(&server, &other_client).await;
    let busy = Lock::new("long")
        .wait(Duration::from_secs(60))
        .client(client(&server));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sections = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (lock, stop, sections) = (busy.clone(), Arc::clone(&stop), Arc::clone(&sections));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                lock.run(async {
                    sections.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await
                })
                .await
                .unwrap();
            }
        }));
    }
    wait_until_async("the busy tasks pass the lock around", LINE_TIMEOUT, || {
        sections.load(Ordering::SeqCst) >= 8
    })
    .await;
    for round in 0..3 {
        // Counted from when it is queued in Redis (before, the busy
        // tasks go on as if it were not there: it is not).
        let waiter = spawn_waiter(&other_client, "long", Duration::from_secs(20));
        wait_until_async("the other client is queued in Redis", LINE_TIMEOUT, || {
            queued_on(&server, "long", &other_channel)
        })
        .await;
        let before = sections.load(Ordering::SeqCst);
        let guard = waited(waiter).await;
        let ran = sections.load(Ordering::SeqCst) - before;
        guard.release().await.unwrap();
        assert!(
            ran <= 6,
            "round {round}: {ran} local sections started while the other client was queued"
        );
        // The busy tasks take the lock back before the next round.
        let now = sections.load(Ordering::SeqCst);
        wait_until_async("the busy tasks run again", LINE_TIMEOUT, || {
            sections.load(Ordering::SeqCst) > now
        })
        .await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
}

/// A holder that hangs past its (unrenewed) ttl does not keep the tasks of
/// its own client waiting in the process: they go to Redis and take the
/// expired lock, as a waiter of another client does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_holder_does_not_hold_up_its_own_client() {
    let server = RedisServer::start();
    let client = client(&server);
    let lock = Lock::new("hung")
        .ttl(Duration::from_millis(500))
        .wait(Duration::from_secs(5))
        .client(client.clone());
    let held = lock.acquire().await.unwrap();
    let asked = Instant::now();
    let guard = lock.acquire().await.expect("taken after the ttl");
    let waited = asked.elapsed();
    // Its wait is 5 s: a task held up by the hung holder waits all of it.
    assert!(
        waited < Duration::from_secs(4),
        "a task of the same client waited {waited:?} for a 500 ms lock"
    );
    drop(guard);
    drop(held);
}

/// A holder's guard dropped while its runtime shuts down (the release task
/// never runs) does not leave the client's other tasks queued for nothing:
/// after the ttl they take the lock at once.
#[test]
fn a_guard_dropped_at_runtime_shutdown_leaves_the_client_usable() {
    let server = RedisServer::start();
    let main = tokio::runtime::Runtime::new().unwrap();
    let client = main.block_on(async { client(&server) });
    let lock = Lock::new("shutdown")
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(5))
        .client(client.clone());
    {
        let secondary = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (holder, waiter) = (lock.clone(), lock.clone());
        secondary.block_on(async {
            tokio::spawn(async move {
                let _guard = holder.acquire().await.unwrap();
                std::future::pending::<()>().await;
            });
            tokio::spawn(async move {
                let _guard = waiter.acquire().await;
                std::future::pending::<()>().await;
            });
            // Both in place: one holds the lock, the other waits for it (in
            // the process, or in Redis for it).
            wait_until_async("the holder holds, the waiter waits", LINE_TIMEOUT, || {
                (client.waiting_in_process("shutdown") == 1
                    || redis(&server, &["LLEN", "lock:{shutdown}:queue"]) == ":1\r\n")
                    && redis(&server, &["EXISTS", "lock:{shutdown}"]) == ":1\r\n"
            })
            .await;
        });
    } // dropped: both tasks with it
    main.block_on(async {
        // From the end of the dead holder's ttl: at once, not after the
        // checks that find a stale cohort (2 s).
        wait_until_async("the dead holder's key expired", LINE_TIMEOUT, || {
            redis(&server, &["EXISTS", "lock:{shutdown}"]) == ":0\r\n"
        })
        .await;
        for _ in 0..2 {
            let asked = Instant::now();
            let guard = lock.acquire().await.unwrap();
            assert!(
                asked.elapsed() < Duration::from_millis(1500),
                "took {:?}",
                asked.elapsed()
            );
            guard.release().await.unwrap();
        }
    });
}

/// A pass that Redis refuses (the key was no longer the passer's: here
/// another holder's token, as after a failover that lost the key) does not
/// start a task that wants a fencing token (it starts on the reply): that
/// task goes to Redis and waits there while the other holder has the key,
/// and the other holder's key is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_redis_refuses_does_not_start_a_fencing_task() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = cohort_holder(&server, &client, "refused", Duration::from_secs(30)).await;
    let (told, mut started) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let lock = Lock::new("refused")
            .ttl(Duration::from_secs(30))
            .wait(Duration::from_secs(30))
            .fencing()
            .client(client.clone());
        async move {
            lock.run(async {
                let _ = told.send(());
            })
            .await
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("refused") == 1
    })
    .await;
    redis(&server, &["SET", "lock:{refused}", "intruder"]);
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    wait_until_async("the waiter queues in Redis", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{refused}:queue"]) == ":1\r\n"
    })
    .await;
    assert!(
        started.try_recv().is_err(),
        "the waiter ran while another client held the key"
    );
    // The other holder's token (followed by the wake mark naming the waiter).
    let held = value(&redis(&server, &["GET", "lock:{refused}"])).unwrap();
    assert!(held.starts_with("intruder"), "{held}");
    // Once the other holder is gone, the waiter gets the lock.
    redis(&server, &["DEL", "lock:{refused}"]);
    waiter.await.unwrap().unwrap();
}

/// The same refused pass with an early start (no fencing): the task started
/// at once, under the passer's lease, is told it lost the lock as soon as
/// the refusal is in (its renewed body stopped), and the other holder's key
/// is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_redis_refuses_stops_the_task_started_early() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = cohort_holder(&server, &client, "refused-early", Duration::from_secs(30)).await;
    let (told, started) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let lock = Lock::new("refused-early")
            .ttl(Duration::from_secs(30))
            .renew()
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move {
            lock.run(async {
                let _ = told.send(());
                std::future::pending::<()>().await
            })
            .await
        }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("refused-early") == 1
    })
    .await;
    redis(&server, &["SET", "lock:{refused-early}", "intruder"]);
    assert!(matches!(
        holder.release().await,
        Err(LockError::Lost { .. })
    ));
    // Started under the passer's lease, unless the refusal was in before
    // the task was first polled (a loaded machine): then its body never
    // starts, and the outcome is the same.
    let _ = started.await;
    let outcome = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("the task started early is stopped once the pass is refused")
        .unwrap();
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                cause: lock_runtime::LostCause::Replaced,
                ..
            })
        ),
        "{outcome:?}"
    );
    let held = value(&redis(&server, &["GET", "lock:{refused-early}"])).unwrap();
    assert_eq!(held, "intruder");
}

/// A local waiter cancelled while the lock is being passed to it (the
/// `HANDOFF` is under way: here Redis is stopped with SIGSTOP meanwhile)
/// has not taken it: the pass, once Redis answers, is passed on or
/// released, so no lock is left held by nobody until its ttl. (A waiter
/// that wants a fencing token: without one the lock is its own at once,
/// the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_while_the_lock_is_passed_to_it_leaves_no_lock_behind() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = cohort_holder(&server, &client, "cancelled", Duration::from_secs(60)).await;
    let waiter = tokio::spawn({
        let lock = Lock::new("cancelled")
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(30))
            .fencing()
            .client(client.clone());
        async move { lock.acquire().await.unwrap() }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("cancelled") == 1
    })
    .await;
    signal(&server, "-STOP");
    let release = tokio::spawn(holder.release());
    wait_until_async("the pass is under way", LINE_TIMEOUT, || {
        client.waiting_in_process("cancelled") == 0
    })
    .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    signal(&server, "-CONT");
    release.await.unwrap().unwrap();
    wait_until_async("the lock is free", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{cancelled}"]) == ":0\r\n"
    })
    .await;
    let again = Lock::new("cancelled").client(client.clone());
    again.try_acquire().await.unwrap().release().await.unwrap();
    assert_eq!(redis(&server, &["EXISTS", "lock:{cancelled}"]), ":0\r\n");
}

/// A lock passed early (the `HANDOFF` in flight, Redis stopped with SIGSTOP)
/// and dropped by its new holder at once: nothing is sent with its token
/// before the `HANDOFF`'s answer, and once Redis answers the lock is
/// released, not left held by nobody until its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_passed_early_and_dropped_at_once_is_released_once_redis_answers() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = cohort_holder(&server, &client, "early-drop", Duration::from_secs(60)).await;
    let waiter = tokio::spawn({
        let lock = Lock::new("early-drop")
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(30))
            .client(client.clone());
        async move { lock.acquire().await.unwrap() }
    });
    wait_until_async("the waiter queues in the process", LINE_TIMEOUT, || {
        client.waiting_in_process("early-drop") == 1
    })
    .await;
    signal(&server, "-STOP");
    let release = tokio::spawn(holder.release());
    // Passed early: the guard comes while Redis is stopped.
    let guard = tokio::time::timeout(LINE_TIMEOUT, waiter)
        .await
        .expect("an early pass does not wait for Redis")
        .unwrap();
    assert!(guard.is_held());
    drop(guard);
    signal(&server, "-CONT");
    release.await.unwrap().unwrap();
    wait_until_async("the lock is free", LINE_TIMEOUT, || {
        redis(&server, &["EXISTS", "lock:{early-drop}"]) == ":0\r\n"
    })
    .await;
    let again = Lock::new("early-drop").client(client.clone());
    again.try_acquire().await.unwrap().release().await.unwrap();
}
