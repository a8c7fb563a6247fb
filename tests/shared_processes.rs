//! The read/write lock and the semaphore across OS processes, on a real
//! redis-server: readers overlap, a writer is alone, a writer is not starved
//! by a stream of readers, a semaphore never lets more than N in, and a
//! SIGKILLed holder's share or permit ends at its own expiry without
//! touching anyone else's.
//!
//! The workers (`lock-worker rw-*` / `sem-*` modes) keep their bookkeeping
//! in Redis under `NAME:...`; a section that sees a holder it should not see
//! INCRs `NAME:violations` and makes its process print `violation ...`
//! instead of `done`.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// The integer stored at `key` (0 when there is none).
fn number(server: &RedisServer, key: &str) -> i64 {
    value(&redis(server, &["GET", key])).map_or(0, |text| text.parse().unwrap())
}

/// The elements of a flat RESP array reply.
fn elements(reply: &str) -> Vec<String> {
    assert!(reply.starts_with('*'), "not an array: {reply:?}");
    reply
        .split("\r\n")
        .skip(1)
        .filter(|line| !line.starts_with('$') && !line.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The members of a sorted set with their scores, as Redis prints them.
fn zset(server: &RedisServer, key: &str) -> Vec<(String, String)> {
    let flat = elements(&redis(server, &["ZRANGE", key, "0", "-1", "WITHSCORES"]));
    flat.chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

/// The server clock in ms (the clock the shares' expiries are on).
fn server_now_ms(server: &RedisServer) -> i64 {
    let time = elements(&redis(server, &["TIME"]));
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// Every key of the lock or semaphore `name` (none once nobody holds or
/// waits).
fn lock_keys(server: &RedisServer, name: &str) -> Vec<String> {
    elements(&redis(server, &["KEYS", &format!("lock:{{{name}}}*")]))
}

/// Starts `count` workers with `args`, waits until each printed `ready`,
/// then sends `go` to all of them, so their sections contend from the start.
fn start_together(server: &RedisServer, count: usize, args: &[&str]) -> Vec<Process> {
    let mut workers: Vec<Process> = (0..count).map(|_| worker(server, args)).collect();
    go(&mut workers);
    workers
}

fn go(workers: &mut [Process]) {
    for worker in workers.iter_mut() {
        assert_eq!(worker.line(LINE_TIMEOUT), "ready");
    }
    for worker in workers.iter_mut() {
        worker.send("go");
    }
}

fn assert_all_done(workers: &mut [Process]) {
    for worker in workers {
        assert_eq!(worker.line(LINE_TIMEOUT * 2), "done");
    }
}

/// `held TOKEN MS` -> (TOKEN, MS).
fn held(line: &str) -> (String, u64) {
    let mut words = line.split(' ');
    assert_eq!(words.next(), Some("held"), "not held: {line:?}");
    let token = words.next().expect("a token").to_owned();
    let took = words.next().expect("a duration").parse().unwrap();
    (token, took)
}

// ---------------------------------------------------------------------------
// Read/write lock.

#[test]
fn readers_in_different_processes_hold_the_lock_together() {
    let server = RedisServer::start();
    // `overlap`: a section waits inside until readers of two processes
    // were inside at once (the lock allows it; a lock that did not would
    // keep them apart, and the count below would show it).
    let mut readers = start_together(
        &server,
        4,
        &["rw-count", "shelf", "read", "2", "20", "overlap"],
    );
    assert_all_done(&mut readers);

    assert_eq!(number(&server, "shelf:violations"), 0);
    assert_eq!(number(&server, "shelf:read-sections"), 4 * 2 * 20);
    let readers_at_once = number(&server, "shelf:max-readers");
    let processes_at_once = number(&server, "shelf:max-reader-procs");
    assert!(
        readers_at_once > 1 && processes_at_once > 1,
        "readers never overlapped: at most {readers_at_once} readers from \
         {processes_at_once} processes at once"
    );
    assert_eq!(lock_keys(&server, "shelf"), Vec::<String>::new());
}

const WRITERS: usize = 4;
const WRITER_TASKS: usize = 4;
const WRITER_SECTIONS: usize = 8;

/// 4 writer processes and 2 reader processes on one lock: returns the
/// writers' and the readers' last lines.
fn writers_and_readers(server: &RedisServer, name: &str, write_mode: &str) -> Vec<String> {
    let (tasks, sections) = (WRITER_TASKS.to_string(), WRITER_SECTIONS.to_string());
    let mut workers: Vec<Process> = (0..WRITERS)
        .map(|_| worker(server, &["rw-count", name, write_mode, &tasks, &sections]))
        .chain((0..2).map(|_| worker(server, &["rw-count", name, "read", "4", "8"])))
        .collect();
    go(&mut workers);
    workers
        .iter_mut()
        .map(|worker| worker.line(LINE_TIMEOUT * 2))
        .collect()
}

#[test]
fn a_writer_is_alone_across_processes() {
    let server = RedisServer::start();
    let lines = writers_and_readers(&server, "ledger", "write");
    assert!(lines.iter().all(|line| line == "done"), "{lines:?}");
    assert_eq!(number(&server, "ledger:violations"), 0);
    // Every non-atomic GET / +1 / SET of the writers counted.
    assert_eq!(
        number(&server, "ledger:counter"),
        (WRITERS * WRITER_TASKS * WRITER_SECTIONS) as i64
    );
    assert_eq!(number(&server, "ledger:read-sections"), 2 * 4 * 8);
    assert_eq!(lock_keys(&server, "ledger"), Vec::<String>::new());
}

/// The control: the same writer sections under the read side are caught by
/// the checks and lose updates, so the test above would catch a write side
/// that lets anyone in beside the writer.
#[test]
fn writers_sharing_the_read_side_are_caught() {
    let server = RedisServer::start();
    let lines = writers_and_readers(&server, "loose", "write-as-read");
    assert!(
        lines[..WRITERS]
            .iter()
            .any(|line| line.starts_with("violation ")),
        "the checks saw no writer beside another: {lines:?}"
    );
    assert!(number(&server, "loose:violations") > 0);
    assert!(
        number(&server, "loose:counter") < (WRITERS * WRITER_TASKS * WRITER_SECTIONS) as i64,
        "no update was lost without exclusion"
    );
}

#[test]
fn a_writer_gets_in_while_readers_keep_coming() {
    let server = RedisServer::start();
    // 8 processes x 4 tasks take the read side back to back: there is
    // nearly always a reader inside, and always one waiting to enter.
    let mut readers: Vec<Process> = (0..8)
        .map(|_| worker(&server, &["rw-hammer", "feed", "4"]))
        .collect();
    for reader in &mut readers {
        assert_eq!(reader.line(LINE_TIMEOUT), "ready");
    }

    let mut writer = worker(&server, &["rw-write-timed", "feed", "30000"]);
    let line = writer.line(LINE_TIMEOUT);
    let took: u64 = line
        .strip_prefix("acquired-after ")
        .unwrap_or_else(|| panic!("the writer did not get in: {line:?}"))
        .parse()
        .unwrap();
    // A waiting writer stops new readers: it waits for the sections already
    // inside (2 ms each, slower on a loaded machine), not for a gap (its
    // connection was open before the clock started).
    assert!(took < 4000, "the writer waited {took} ms");

    // The readers queued behind the writer get back in after it.
    let after_writer = number(&server, "feed:read-sections");
    wait_until("readers enter again", LINE_TIMEOUT, || {
        number(&server, "feed:read-sections") > after_writer + 32
    });
    for reader in &mut readers {
        reader.send("stop");
    }
    assert_all_done(&mut readers);
    assert_eq!(number(&server, "feed:violations"), 0);
    assert!(number(&server, "feed:max-reader-procs") > 1);
    assert_eq!(lock_keys(&server, "feed"), Vec::<String>::new());
}

#[test]
fn a_killed_readers_share_ends_at_its_expiry_and_no_other() {
    let server = RedisServer::start();
    let (writer_key, readers_key) = ("lock:{catalog}:rw", "lock:{catalog}:rw:readers");
    // The victim comes first to an idle lock: it is the lone reader, its
    // share the writer key `r:<token>` with the key's own expiry.
    // Long ttls while the processes start; the victim's share is shortened
    // (to 1.5 s) once everyone is in place.
    let mut victim = worker(&server, &["rw-hold", "catalog", "read", "60000"]);
    let (victim_token, _) = held(&victim.line(LINE_TIMEOUT));
    let lone = format!("r:{victim_token}");
    assert_eq!(
        value(&redis(&server, &["GET", writer_key])),
        Some(lone.clone())
    );
    let mut others: Vec<(Process, String)> = (0..2)
        .map(|_| {
            let mut reader = worker(&server, &["rw-hold", "catalog", "read", "120000"]);
            let (token, _) = held(&reader.line(LINE_TIMEOUT));
            (reader, token)
        })
        .collect();
    let pttl = |server: &RedisServer| -> i64 {
        value(&redis(server, &["PTTL", writer_key]))
            .unwrap()
            .parse()
            .unwrap()
    };
    let shares = zset(&server, readers_key);
    assert_eq!(shares.len(), 2, "{shares:?}");
    let victim_expiry = server_now_ms(&server) + pttl(&server);
    for (_, expiry) in &shares {
        assert!(
            expiry.parse::<i64>().unwrap() > victim_expiry + 5000,
            "{shares:?}"
        );
    }

    let left_before = pttl(&server);
    victim.kill_hard(); // no release: only its expiry ends its share
    assert_eq!(
        zset(&server, readers_key),
        shares,
        "the kill changed the shares"
    );
    assert_eq!(
        value(&redis(&server, &["GET", writer_key])),
        Some(lone.clone())
    );
    assert!(
        pttl(&server) <= left_before,
        "the kill extended the dead share"
    );

    // A writer waits for the readers, dead one included; while it waits,
    // new readers stay out.
    let mut writer = worker(&server, &["rw-hold", "catalog", "write", "10000", "20000"]);
    wait_until("the writer waits in line", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{catalog}:rw:queue"]) == ":1\r\n"
    });
    let mut newcomer = worker(&server, &["rw-try", "catalog", "read"]);
    assert_eq!(newcomer.line(LINE_TIMEOUT), "busy");

    // The dead share's ttl runs out in 1.5 s.
    assert_eq!(redis(&server, &["PEXPIRE", writer_key, "1500"]), ":1\r\n");
    let victim_expiry = server_now_ms(&server) + pttl(&server);

    // The dead share goes once its ttl has passed on the server clock (the
    // waiting writer's attempts prune it), and not before.
    let left = Duration::from_millis((victim_expiry - server_now_ms(&server)).max(0) as u64);
    wait_until(
        "the killed reader's share is gone",
        left + Duration::from_secs(2),
        || {
            if value(&redis(&server, &["GET", writer_key])) != Some(lone.clone()) {
                return true;
            }
            assert!(
                server_now_ms(&server) <= victim_expiry + 1500,
                "an expired share was still counted 1.5 s after its expiry"
            );
            false
        },
    );
    assert!(server_now_ms(&server) >= victim_expiry);
    // The live readers' shares, expiries included, are untouched, and they
    // still keep the writer out.
    assert_eq!(zset(&server, readers_key), shares);

    for (reader, _) in &mut others {
        reader.send("release");
        assert_eq!(reader.line(LINE_TIMEOUT), "released");
    }
    let (writer_token, _) = held(&writer.line(LINE_TIMEOUT));
    assert_eq!(
        value(&redis(&server, &["GET", writer_key])),
        Some(writer_token)
    );
    writer.send("release");
    assert_eq!(writer.line(LINE_TIMEOUT), "released");
    assert_eq!(lock_keys(&server, "catalog"), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// Semaphore.

#[test]
fn a_semaphore_never_lets_more_than_its_permits_in() {
    let server = RedisServer::start();
    // `fill`: a section waits inside until the permits were all taken at
    // once (reached whenever the semaphore allows it).
    let mut workers = start_together(
        &server,
        4,
        &["sem-count", "exports", "3", "3", "15", "fill"],
    );
    assert_all_done(&mut workers);
    assert_eq!(number(&server, "exports:violations"), 0);
    // Reached, never exceeded: in the sections, and in the semaphore's ZSET.
    assert_eq!(number(&server, "exports:max-inside"), 3);
    assert_eq!(number(&server, "exports:max-holders"), 3);
    assert_eq!(lock_keys(&server, "exports"), Vec::<String>::new());
}

#[test]
fn a_killed_permit_holders_permit_comes_back_at_its_expiry() {
    let server = RedisServer::start();
    let permits_key = "lock:{printer}:sem";
    // A long ttl while the processes start; the dead permit's expiry is
    // brought to 1 s from now once the waiter waits.
    let mut holder = worker(&server, &["sem-hold", "printer", "1", "60000"]);
    let (holder_token, _) = held(&holder.line(LINE_TIMEOUT));
    let mut other = worker(&server, &["sem-try", "printer", "1"]);
    assert_eq!(other.line(LINE_TIMEOUT), "busy");
    let holder_member = format!("1|{holder_token}");
    let mut waiter = worker(&server, &["sem-hold", "printer", "1", "10000", "60000"]);
    wait_until("the waiter waits in line", LINE_TIMEOUT, || {
        redis(&server, &["LLEN", "lock:{printer}:sem:queue"]) == ":1\r\n"
    });

    holder.kill_hard(); // no release: only its expiry gives the permit back
    let holder_expiry = server_now_ms(&server) + 1000;
    assert_eq!(
        redis(
            &server,
            &[
                "ZADD",
                permits_key,
                "XX",
                "CH",
                &holder_expiry.to_string(),
                &holder_member
            ]
        ),
        ":1\r\n",
        "the holder's permit"
    );
    let left = holder_expiry - server_now_ms(&server);
    let started = Instant::now();
    let (waiter_token, took) = held(&waiter.line(LINE_TIMEOUT));
    let elapsed = started.elapsed();

    // Taken on the server clock at or after the dead permit's expiry, and
    // soon after it.
    let waiter_member = format!("1|{waiter_token}");
    let waiter_expiry: i64 = value(&redis(&server, &["ZSCORE", permits_key, &waiter_member]))
        .expect("the waiter's permit")
        .parse()
        .unwrap();
    let taken_at = waiter_expiry - 10_000;
    assert!(
        taken_at >= holder_expiry,
        "the permit was taken {} ms before the dead holder's expiry",
        holder_expiry - taken_at
    );
    assert!(
        taken_at - holder_expiry < 1000,
        "the permit came back {} ms after the dead holder's expiry",
        taken_at - holder_expiry
    );
    assert!(
        elapsed < Duration::from_millis(left.max(0) as u64 + 1500),
        "the waiter got the permit {elapsed:?} after the kill ({left} ms of ttl left, its \
         acquire took {took} ms)"
    );
    let members: Vec<String> = zset(&server, permits_key)
        .into_iter()
        .map(|(member, _)| member)
        .collect();
    assert_eq!(members, [waiter_member, "#capacity:1".to_owned()]);

    waiter.send("release");
    assert_eq!(waiter.line(LINE_TIMEOUT), "released");
    assert_eq!(lock_keys(&server, "printer"), Vec::<String>::new());
}
