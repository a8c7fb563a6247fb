//! The Lua scripts of the shared locks (read/write lock, semaphore, share
//! renewal), driven directly with EVAL against a private redis-server: each
//! test starts its own server.

mod common;
use common::*;

use std::time::{Duration, Instant};

use redis::{Connection, FromRedisValue};

/// A script: the helper files it is preceded by, then its own file.
macro_rules! script {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../lock-runtime/src/backend/lua/", $file))),+)
    };
}

const RW_ACQUIRE: &str = script!(
    "publish.lua",
    "shares.lua",
    "rw_state.lua",
    "rw_acquire.lua"
);
const RW_RELEASE: &str = script!(
    "publish.lua",
    "shares.lua",
    "rw_state.lua",
    "rw_release.lua"
);
const RW_LEAVE: &str = script!("publish.lua", "shares.lua", "rw_state.lua", "rw_leave.lua");
const SEM_ACQUIRE: &str = script!(
    "publish.lua",
    "shares.lua",
    "semaphore.lua",
    "semaphore_acquire.lua"
);
const SEM_RELEASE: &str = script!(
    "publish.lua",
    "shares.lua",
    "semaphore.lua",
    "semaphore_release.lua"
);
const SEM_LEAVE: &str = script!(
    "publish.lua",
    "shares.lua",
    "semaphore.lua",
    "semaphore_leave.lua"
);
const RENEW_SHARES: &str = script!("publish.lua", "shares.lua", "renew_shares.lua");

/// Keys of the read/write lock `rw`: writer, readers, queue, deadlines, fence.
const RW: [&str; 5] = ["{rw}:w", "{rw}:r", "{rw}:q", "{rw}:d", "{rw}:f"];
/// Keys of the semaphore `sem`: permits, queue, deadlines.
const SEM: [&str; 3] = ["{sem}:p", "{sem}:q", "{sem}:d"];

const LONG: u64 = 30_000;
/// A bound on waits for an expiry (generous: reached only when something
/// hangs).
const WAIT: Duration = LINE_TIMEOUT;
/// The ttl of a holder that is to expire while another script runs behind
/// it: the second script must reach Redis within it, so it is not the
/// 50 ms that a loaded machine can exceed between two commands.
const SHORT: u64 = 500;

fn connect(server: &RedisServer) -> Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn eval<T: FromRedisValue>(con: &mut Connection, script: &str, keys: &[&str], args: &[&str]) -> T {
    redis::cmd("EVAL")
        .arg(script)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query(con)
        .unwrap_or_else(|error| panic!("EVAL {keys:?} {args:?}: {error}"))
}

fn query<T: FromRedisValue>(con: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    cmd.query(con)
        .unwrap_or_else(|error| panic!("{args:?}: {error}"))
}

fn exists(con: &mut Connection, key: &str) -> bool {
    query::<i64>(con, &["EXISTS", key]) == 1
}

fn server_ms(con: &mut Connection) -> i64 {
    let time: Vec<String> = query(con, &["TIME"]);
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// A read/write lock attempt.
#[derive(Clone, Copy)]
struct Rw<'a> {
    mode: &'a str,
    token: &'a str,
    channel: &'a str,
    ttl: u64,
    fence: u64,
    join: bool,
    fair: bool,
    mine: bool,
}

impl<'a> Rw<'a> {
    fn read(token: &'a str) -> Self {
        Rw {
            mode: "r",
            token,
            channel: "c",
            ttl: LONG,
            fence: 0,
            join: false,
            fair: true,
            mine: false,
        }
    }

    fn write(token: &'a str) -> Self {
        Rw {
            mode: "w",
            ..Rw::read(token)
        }
    }

    fn on(self, channel: &'a str) -> Self {
        Rw {
            channel,
            join: true,
            ..self
        }
    }

    fn entry(&self) -> String {
        format!("{}|{}|{}", self.mode, self.channel, self.token)
    }

    fn acquire(&self, con: &mut Connection) -> Vec<i64> {
        let flag = |b: bool| if b { "1" } else { "0" };
        eval(
            con,
            RW_ACQUIRE,
            &RW,
            &[
                self.mode,
                self.token,
                &self.ttl.to_string(),
                &self.fence.to_string(),
                "10000",
                flag(self.join),
                flag(self.fair),
                &self.entry(),
                flag(self.mine),
            ],
        )
    }

    fn release(&self, con: &mut Connection) -> i64 {
        eval(con, RW_RELEASE, &RW, &[self.mode, self.token, "0"])
    }

    fn leave(&self, con: &mut Connection) -> i64 {
        eval(con, RW_LEAVE, &RW, &[&self.entry()])
    }
}

/// A semaphore attempt (capacity `n`, `k` permits).
#[derive(Clone, Copy)]
struct Sem<'a> {
    token: &'a str,
    channel: &'a str,
    k: u32,
    n: u32,
    ttl: u64,
    join: bool,
}

impl<'a> Sem<'a> {
    fn new(token: &'a str, k: u32, n: u32) -> Self {
        Sem {
            token,
            channel: "c",
            k,
            n,
            ttl: LONG,
            join: false,
        }
    }

    fn on(self, channel: &'a str) -> Self {
        Sem {
            channel,
            join: true,
            ..self
        }
    }

    fn entry(&self) -> String {
        format!("{}|{}|{}", self.k, self.channel, self.token)
    }

    fn acquire(&self, con: &mut Connection) -> Vec<i64> {
        eval(
            con,
            SEM_ACQUIRE,
            &SEM,
            &[
                self.token,
                &self.ttl.to_string(),
                &self.k.to_string(),
                &self.n.to_string(),
                "10000",
                if self.join { "1" } else { "0" },
                "1",
                &self.entry(),
                "0",
            ],
        )
    }

    fn release(&self, con: &mut Connection) -> i64 {
        eval(con, SEM_RELEASE, &SEM, &[self.token, &self.k.to_string()])
    }

    /// A release of a semaphore whose holders are not fair.
    fn release_unfair(&self, con: &mut Connection) -> i64 {
        eval(
            con,
            SEM_RELEASE,
            &SEM,
            &[self.token, &self.k.to_string(), "0"],
        )
    }

    fn leave(&self, con: &mut Connection) -> i64 {
        eval(con, SEM_LEAVE, &SEM, &[&self.entry(), &self.n.to_string()])
    }
}

/// Subscribes a second connection to `channels`; `messages` then collects
/// what they received so far.
struct Listener {
    subscriber: Connection,
    publisher: Connection,
}

/// The channel of [`Listener`]'s end-of-messages marker.
const MARKER: &str = "marker";

impl Listener {
    fn new(server: &RedisServer, channels: &[&str]) -> Listener {
        let mut subscriber = connect(server);
        let mut cmd = redis::cmd("SUBSCRIBE");
        cmd.arg(channels).arg(MARKER);
        subscriber
            .send_packed_command(&cmd.get_packed_command())
            .unwrap();
        for _ in 0..=channels.len() {
            subscriber.recv_response().unwrap();
        }
        // only a bound: every read ends with the marker
        subscriber
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Listener {
            subscriber,
            publisher: connect(server),
        }
    }

    /// (channel, payload) of every message published so far: a marker is
    /// published, and the messages before it (in order) are returned.
    fn messages(&mut self) -> Vec<(String, String)> {
        assert_eq!(
            query::<i64>(&mut self.publisher, &["PUBLISH", MARKER, "end"]),
            1
        );
        let mut messages = Vec::new();
        loop {
            let value = self.subscriber.recv_response().unwrap();
            let msg = redis::Msg::from_owned_value(value).expect("a pub/sub message");
            if msg.get_channel_name() == MARKER {
                return messages;
            }
            messages.push((
                msg.get_channel_name().to_owned(),
                msg.get_payload::<String>().unwrap(),
            ));
        }
    }
}

/// Calls `attempt` until it answers `{1, ...}`, within `WAIT`.
fn poll_until_acquired(mut attempt: impl FnMut() -> Vec<i64>) -> Duration {
    let start = Instant::now();
    loop {
        if attempt()[0] == 1 {
            return start.elapsed();
        }
        assert!(start.elapsed() < WAIT, "not acquired within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_readers_overlap_and_block_a_writer() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Rw::read("r1").acquire(con), [1, 0]);
    assert_eq!(Rw::read("r2").acquire(con), [1, 0]);
    assert_eq!(query::<i64>(con, &["ZCARD", RW[1]]), 2);
    let pttl = query::<i64>(con, &["PTTL", RW[1]]);
    assert!(pttl > 0 && pttl <= LONG as i64, "{pttl}");
    let blocked = Rw::write("w1").acquire(con);
    assert_eq!(blocked[0], 0);
    assert!(blocked[1] > 0 && blocked[1] <= LONG as i64, "{blocked:?}");
    assert!(!exists(con, RW[0]));
    assert!(!exists(con, RW[2]), "not joined: no queue");
}

#[test]
fn writer_blocked_by_reader_gets_in_after_release() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["cw"]);
    let reader = Rw::read("r1");
    let writer = Rw::write("w1").on("cw");
    assert_eq!(reader.acquire(con), [1, 0]);
    assert_eq!(writer.acquire(con)[0], 0);
    assert_eq!(
        query::<Vec<String>>(con, &["LRANGE", RW[2], "0", "-1"]),
        ["w|cw|w1"]
    );
    assert_eq!(reader.release(con), 2, "released, and woke a waiter");
    assert_eq!(listener.messages(), [("cw".to_owned(), "w1".to_owned())]);
    assert_eq!(writer.acquire(con), [1, 0]);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "w1");
    assert!(!exists(con, RW[2]) && !exists(con, RW[3]), "entry removed");
    // a reader is now blocked by the writer, hint = its PTTL
    let blocked = Rw::read("r2").acquire(con);
    assert_eq!(blocked[0], 0);
    assert!(blocked[1] > 0 && blocked[1] <= LONG as i64, "{blocked:?}");
    assert_eq!(writer.release(con), 1);
    assert!(!exists(con, RW[0]));
}

#[test]
fn queued_writer_stops_new_readers() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["cw", "cr"]);
    let r0 = Rw::read("r0");
    let r1 = Rw::read("r1");
    let w1 = Rw::write("w1").on("cw");
    let r2 = Rw::read("r2").on("cr");
    assert_eq!(r0.acquire(con), [1, 0]);
    assert_eq!(r1.acquire(con), [1, 0]);
    assert_eq!(w1.acquire(con)[0], 0);
    // writer preference: a queued writer stops a new reader
    assert_eq!(Rw::read("r3").acquire(con), [0, -2]);
    assert_eq!(r2.acquire(con), [0, -2]);
    // a read release that leaves a live reader wakes nobody
    assert_eq!(r0.release(con), 1);
    assert!(listener.messages().is_empty());
    assert_eq!(r1.release(con), 2, "released, and woke a waiter");
    assert_eq!(listener.messages(), [("cw".to_owned(), "w1".to_owned())]);
    assert_eq!(r2.acquire(con), [0, -2], "still behind the writer");
    assert_eq!(w1.acquire(con), [1, 0]);
    assert_eq!(w1.release(con), 2, "released, and woke a waiter");
    assert_eq!(listener.messages(), [("cr".to_owned(), "r2".to_owned())]);
    assert_eq!(r2.acquire(con), [1, 0]);
    assert_eq!(
        query::<Vec<String>>(con, &["LRANGE", RW[2], "0", "-1"]),
        Vec::<String>::new()
    );
}

/// The uncontended read acquire of the client: `SET <writer key>
/// r:<token> NX PX ttl` and `EXISTS <queue>` in one pipeline, no script (a
/// lone reader); a share taken while waiters are queued is given back at
/// once (the read release), and the client would run the acquire script.
fn lone_read(con: &mut Connection, token: &str) -> bool {
    let value = format!("r:{token}");
    let (set, queued): (Option<String>, bool) = redis::pipe()
        .cmd("SET")
        .arg(RW[0])
        .arg(&value)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .cmd("EXISTS")
        .arg(RW[2])
        .query(con)
        .unwrap();
    if set.is_some() && queued {
        assert!(
            matches!(Rw::read(token).release(con), 1 | 2),
            "the share given back (2: and the head woken)"
        );
        return false;
    }
    set.is_some()
}

#[test]
fn a_lone_reader_is_a_share_like_the_others() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["cw"]);
    assert!(lone_read(con, "r0"));
    // other readers share the lock (in the ZSET), a writer waits for both
    assert_eq!(Rw::read("r1").acquire(con), [1, 0]);
    let w1 = Rw::write("w1").on("cw");
    let blocked = w1.acquire(con);
    assert_eq!(blocked[0], 0);
    assert!(blocked[1] > 25_000, "the lone reader's PTTL: {blocked:?}");
    // mine finds the lone reader's share; a writer token never matches it
    let mine = Rw {
        mine: true,
        ..Rw::read("r0")
    };
    assert_eq!(mine.acquire(con)[0], 1);
    assert_eq!(
        Rw {
            mine: true,
            ..Rw::write("r0")
        }
        .release(con),
        -1
    );
    assert_eq!(Rw::read("r1").release(con), 1);
    assert!(listener.messages().is_empty(), "the lone reader is live");
    // its release frees the writer key for the gate and wakes the writer
    assert_eq!(
        Rw::read("r0").release(con),
        2,
        "released, and woke a waiter"
    );
    assert_eq!(listener.messages(), [("cw".to_owned(), "w1".to_owned())]);
    assert_eq!(
        query::<Option<String>>(con, &["GET", RW[0]]).as_deref(),
        Some("q")
    );
    assert_eq!(Rw::read("r0").release(con), 0, "released twice: lost");
    assert_eq!(w1.acquire(con), [1, 0]);
    assert_eq!(w1.release(con), 1);
    for key in RW {
        assert!(!exists(con, key), "{key}");
    }
}

#[test]
fn a_queued_writer_closes_the_plain_reader_path() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    // a writer queued behind ZSET readers: the gate stops the plain SET
    assert_eq!(Rw::read("r0").acquire(con), [1, 0]);
    let w1 = Rw::write("w1").on("cw");
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(
        query::<Option<String>>(con, &["GET", RW[0]]).as_deref(),
        Some("q")
    );
    let gate_ttl: i64 = query(con, &["PTTL", RW[0]]);
    assert!(
        gate_ttl > 0 && gate_ttl <= 20_000,
        "the queue's ttl: {gate_ttl}"
    );
    assert!(!lone_read(con, "r1"), "a reader passed a queued writer");
    assert_eq!(Rw::read("r1").acquire(con), [0, -2]);
    // the writer gives up: the gate goes with it, and readers enter again
    assert_eq!(w1.leave(con), 1);
    assert!(!exists(con, RW[0]));
    assert!(lone_read(con, "r1"));
    // a writer queued behind the lone reader: its release leaves the gate
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(Rw::read("r1").release(con), 1);
    assert!(!lone_read(con, "r2"), "a reader passed the woken writer");
    assert_eq!(
        Rw::read("r0").release(con),
        2,
        "released, and woke a waiter"
    );
    assert_eq!(w1.acquire(con), [1, 0]);
    // a writer released with waiters left: the gate again, not a free key
    let r3 = Rw::read("r3").on("cr");
    let w2 = Rw::write("w2").on("cw");
    assert_eq!(r3.acquire(con)[0], 0);
    assert_eq!(w2.acquire(con)[0], 0);
    assert_eq!(w1.release(con), 2, "released, and woke a waiter");
    assert!(!lone_read(con, "r4"));
    assert_eq!(r3.acquire(con), [1, 0], "ahead of w2");
    assert!(!lone_read(con, "r4"), "w2 still waits");
    assert_eq!(r3.release(con), 2, "released, and woke a waiter");
    assert_eq!(w2.acquire(con), [1, 0]);
    assert_eq!(w2.release(con), 1);
    for key in RW {
        assert!(!exists(con, key), "{key}");
    }
}

#[test]
fn a_stale_gate_is_cleared_by_the_next_script() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Rw::read("r0").acquire(con), [1, 0]);
    // a writer queues, then dies: it stops refreshing its place
    let w1 = Rw::write("w1").on("cw");
    assert_eq!(w1.acquire(con)[0], 0);
    assert!(exists(con, RW[0]), "the gate");
    query::<i64>(con, &["ZADD", RW[3], "1", &w1.entry()]);
    // the next script prunes the dead waiter and the gate with it
    assert_eq!(Rw::read("r1").acquire(con), [1, 0]);
    assert!(!exists(con, RW[0]) && !exists(con, RW[2]));
    assert!(lone_read(con, "r2"));
}

#[test]
fn a_lone_reader_is_renewed_and_never_revived() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert!(lone_read(con, "r0"));
    query::<i64>(con, &["PEXPIRE", RW[0], "10000"]);
    let renewed: Vec<i64> = eval(
        con,
        RENEW_SHARES,
        &[RW[0], RW[1], RW[0], RW[1]],
        &["r0", "60000", "2", "r9", "60000", "2"],
    );
    assert_eq!(renewed, [1, 0]);
    assert!(query::<i64>(con, &["PTTL", RW[0]]) > 50_000);
    assert!(!exists(con, RW[1]), "nothing created");
    // a writer's key (or the gate) is never extended for a reader
    query::<()>(con, &["SET", RW[0], "r0", "PX", "1000"]);
    let renewed: Vec<i64> = eval(con, RENEW_SHARES, &[RW[0], RW[1]], &["r0", "60000", "2"]);
    assert_eq!(renewed, [0]);
    assert!(query::<i64>(con, &["PTTL", RW[0]]) <= 1000);
}

#[test]
fn reader_queued_before_a_writer_is_not_stopped_by_it() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let w0 = Rw::write("w0");
    assert_eq!(w0.acquire(con), [1, 0]);
    let r1 = Rw::read("r1").on("c");
    let w1 = Rw::write("w1").on("c");
    assert_eq!(r1.acquire(con)[0], 0);
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(w0.release(con), 2, "released, and woke a waiter");
    // r1 is ahead of w1: it may enter; w1 then waits for r1's share
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(r1.acquire(con), [1, 0]);
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(r1.release(con), 2, "released, and woke a waiter");
    assert_eq!(w1.acquire(con), [1, 0]);
}

#[test]
fn leaving_writer_wakes_the_readers_behind_it() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["cw", "cr"]);
    assert_eq!(Rw::read("r0").acquire(con), [1, 0]);
    let w1 = Rw::write("w1").on("cw");
    let r1 = Rw::read("r1").on("cr");
    assert_eq!(w1.acquire(con)[0], 0);
    assert_eq!(r1.acquire(con), [0, -2]);
    assert_eq!(w1.leave(con), 1);
    assert_eq!(listener.messages(), [("cr".to_owned(), "r1".to_owned())]);
    assert_eq!(r1.acquire(con), [1, 0]);
    assert!(!exists(con, RW[2]) && !exists(con, RW[3]));
}

#[test]
fn read_release_never_touches_the_writer_key() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    query::<()>(con, &["SET", RW[0], "writer", "PX", "30000"]);
    assert_eq!(Rw::read("other").release(con), 0);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "writer");
    assert!(!exists(con, RW[1]), "nothing created");
    // even the release of a real share leaves a writer key alone
    query::<()>(con, &["ZADD", RW[1], "99999999999999", "r1"]);
    assert_eq!(Rw::read("r1").release(con), 1);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "writer");
    // a read release with the writer's own token: still untouched
    assert_eq!(Rw::read("writer").release(con), 0);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "writer");
}

#[test]
fn write_release_checks_the_token_and_keeps() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let w1 = Rw::write("w1");
    assert_eq!(w1.acquire(con), [1, 0]);
    assert_eq!(Rw::write("w2").release(con), -1);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "w1");
    // hold_at_least: kept under another value, still blocking
    assert_eq!(eval::<i64>(con, RW_RELEASE, &RW, &["w", "w1", "5000"]), 1);
    assert_eq!(query::<String>(con, &["GET", RW[0]]), "kept:w1");
    let pttl = query::<i64>(con, &["PTTL", RW[0]]);
    assert!(pttl > 0 && pttl <= 5000, "{pttl}");
    assert_eq!(eval::<i64>(con, RW_RELEASE, &RW, &["w", "w1", "5000"]), 1);
    assert_eq!(Rw::read("r1").acquire(con)[0], 0);
    assert_eq!(Rw::write("w3").acquire(con)[0], 0);
    query::<()>(con, &["DEL", RW[0]]);
    assert_eq!(w1.release(con), 0, "gone");
}

#[test]
fn expired_reader_share_frees_a_writer_without_release() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let reader = Rw {
        ttl: SHORT,
        ..Rw::read("r1")
    };
    assert_eq!(reader.acquire(con), [1, 0]);
    let writer = Rw::write("w1");
    let blocked = writer.acquire(con);
    assert_eq!(blocked[0], 0);
    assert!(blocked[1] > 0 && blocked[1] <= SHORT as i64, "{blocked:?}");
    poll_until_acquired(|| writer.acquire(con));
    assert!(!exists(con, RW[1]), "expired share removed");
    assert_eq!(reader.release(con), 0, "lost");
}

#[test]
fn mine_reports_a_held_share() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let writer = Rw {
        fence: 60_000,
        ..Rw::write("w1")
    };
    let fence = writer.acquire(con)[1];
    assert!(fence > 0);
    let again = Rw {
        mine: true,
        ..writer
    }
    .acquire(con);
    assert_eq!(again[..2], [1, fence]);
    assert!(again[2] > 0 && again[2] <= LONG as i64, "{again:?}");
    assert_eq!(writer.release(con), 1);
    let reader = Rw {
        mine: true,
        ..Rw::read("r1")
    };
    assert_eq!(reader.acquire(con), [1, 0], "not held: a fresh acquire");
    let again = reader.acquire(con);
    assert_eq!(again[..2], [1, 0]);
    assert!(again[2] > 0 && again[2] <= LONG as i64, "{again:?}");
    assert_eq!(query::<i64>(con, &["ZCARD", RW[1]]), 1);
}

#[test]
fn fencing_tokens_strictly_increase_for_writers() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut last = 0;
    for i in 0..20 {
        let token = format!("w{i}");
        let writer = Rw {
            fence: 60_000,
            ..Rw::write(&token)
        };
        let reply = writer.acquire(con);
        assert_eq!(reply[0], 1);
        assert!(reply[1] > last, "{} after {last}", reply[1]);
        last = reply[1];
        assert_eq!(writer.release(con), 1);
    }
    // a fence counter ahead of the clock is still exceeded
    let ahead = (last + 1_000_000_000).to_string();
    query::<()>(con, &["SET", RW[4], &ahead, "PX", "60000"]);
    let writer = Rw {
        fence: 60_000,
        ..Rw::write("late")
    };
    assert_eq!(writer.acquire(con), [1, last + 1_000_000_001]);
    // no fencing asked: the fence key is untouched
    assert_eq!(writer.release(con), 1);
    assert_eq!(Rw::write("plain").acquire(con), [1, 0]);
    assert_eq!(query::<i64>(con, &["GET", RW[4]]), last + 1_000_000_001);
}

#[test]
fn write_release_wakes_readers_grouped_by_channel() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["ca", "cb", "cc"]);
    let w1 = Rw::write("w1");
    assert_eq!(w1.acquire(con), [1, 0]);
    for reader in [
        Rw::read("r1").on("ca"),
        Rw::read("r2").on("cb"),
        Rw::read("r3").on("ca"),
        Rw::write("w2").on("cc"),
        Rw::read("r4").on("ca"),
    ] {
        assert_eq!(reader.acquire(con)[0], 0);
    }
    assert_eq!(query::<i64>(con, &["LLEN", RW[2]]), 5);
    assert_eq!(w1.release(con), 2, "released, and woke a waiter");
    let mut messages = listener.messages();
    messages.sort();
    assert_eq!(
        messages,
        [
            ("ca".to_owned(), "r1 r3".to_owned()),
            ("cb".to_owned(), "r2".to_owned())
        ]
    );
}

#[test]
fn dead_waiters_are_pruned_from_the_whole_queue() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Rw::write("w0").acquire(con), [1, 0]);
    assert_eq!(Rw::read("r1").on("c").acquire(con)[0], 0);
    assert_eq!(Rw::write("w1").on("c").acquire(con)[0], 0);
    assert_eq!(Rw::read("r2").on("c").acquire(con)[0], 0);
    // w1 stopped refreshing: its deadline passed
    query::<()>(con, &["ZADD", RW[3], "1", "w|c|w1"]);
    assert_eq!(Rw::read("r3").on("c").acquire(con)[0], 0);
    assert_eq!(
        query::<Vec<String>>(con, &["LRANGE", RW[2], "0", "-1"]),
        ["r|c|r1", "r|c|r2", "r|c|r3"]
    );
    assert_eq!(query::<i64>(con, &["ZCARD", RW[3]]), 3);
}

#[test]
fn renewal_touches_only_its_own_share_and_never_revives() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Rw::read("r1").acquire(con), [1, 0]);
    assert_eq!(Rw::read("r2").acquire(con), [1, 0]);
    let short = Rw {
        ttl: 50,
        ..Rw::read("r3")
    };
    assert_eq!(short.acquire(con), [1, 0]);
    let r2_score: i64 = query(con, &["ZSCORE", RW[1], "r2"]);
    let r1_score: i64 = query(con, &["ZSCORE", RW[1], "r1"]);
    let pttl_before = query::<i64>(con, &["PTTL", RW[1]]);
    std::thread::sleep(Duration::from_millis(5));
    let renewed: Vec<i64> = eval(con, RENEW_SHARES, &[RW[1]], &["r1", "60000", "1"]);
    assert_eq!(renewed, [1]);
    assert!(query::<i64>(con, &["ZSCORE", RW[1], "r1"]) > r1_score);
    assert_eq!(query::<i64>(con, &["ZSCORE", RW[1], "r2"]), r2_score);
    assert!(query::<i64>(con, &["PTTL", RW[1]]) > pttl_before);
    // a shorter ttl never shortens the key's
    let renewed: Vec<i64> = eval(con, RENEW_SHARES, &[RW[1]], &["r2", "100", "1"]);
    assert_eq!(renewed, [1]);
    assert!(query::<i64>(con, &["PTTL", RW[1]]) > 1000);
    // r3 expires: its renewal removes it, never revives it
    let expiry: i64 = query(con, &["ZSCORE", RW[1], "r3"]);
    wait_until("r3 expired", WAIT, || server_ms(con) > expiry);
    let renewed: Vec<i64> = eval(
        con,
        RENEW_SHARES,
        &[RW[1], RW[1], "{rw}:none"],
        &["r3", "60000", "1", "r1", "60000", "1", "r9", "60000", "1"],
    );
    assert_eq!(renewed, [0, 1, 0]);
    assert_eq!(query::<Option<i64>>(con, &["ZSCORE", RW[1], "r3"]), None);
    assert!(!exists(con, "{rw}:none"), "nothing created");
    assert_eq!(query::<i64>(con, &["ZCARD", RW[1]]), 2);
}

#[test]
fn release_of_unknown_or_expired_share_creates_nothing() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Rw::read("r1").release(con), 0);
    assert_eq!(Rw::write("w1").release(con), 0);
    for key in RW {
        assert!(!exists(con, key), "{key}");
    }
    let short = Rw {
        ttl: 30,
        ..Rw::read("r1")
    };
    assert_eq!(short.acquire(con), [1, 0]);
    let expiry: i64 = query(con, &["ZSCORE", RW[1], "r1"]);
    wait_until("r1 expired", WAIT, || server_ms(con) > expiry);
    assert_eq!(short.release(con), 0);
    for key in RW {
        assert!(!exists(con, key), "{key}");
    }
    assert_eq!(Sem::new("s1", 1, 2).release(con), 0);
    for key in SEM {
        assert!(!exists(con, key), "{key}");
    }
}

#[test]
fn semaphore_admits_up_to_capacity() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Sem::new("a", 1, 2).acquire(con), [1, 0]);
    assert_eq!(Sem::new("b", 1, 2).acquire(con), [1, 0]);
    let third = Sem::new("c", 1, 2).acquire(con);
    assert_eq!(third[0], 0);
    assert!(third[1] > 0 && third[1] <= LONG as i64, "{third:?}");
    assert_eq!(Sem::new("c", 1, 3).acquire(con), [-3, 2]);
    assert_eq!(Sem::new("c", 3, 2).acquire(con), [-4, 2]);
    assert_eq!(
        query::<Vec<String>>(con, &["ZRANGE", SEM[0], "0", "-1"]),
        ["1|a", "1|b", "#capacity:2"]
    );
    let pttl = query::<i64>(con, &["PTTL", SEM[0]]);
    assert!(pttl > 0 && pttl <= LONG as i64, "{pttl}");
    assert_eq!(Sem::new("a", 1, 2).release(con), 1);
    assert_eq!(Sem::new("c", 1, 2).acquire(con), [1, 0]);
    // once nobody holds, another capacity may be used
    assert_eq!(Sem::new("b", 1, 2).release(con), 1);
    assert_eq!(Sem::new("c", 1, 2).release(con), 1);
    assert!(!exists(con, SEM[0]), "capacity gone with the last holder");
    assert_eq!(Sem::new("d", 1, 5).acquire(con), [1, 0]);
    assert_eq!(Sem::new("e", 1, 2).acquire(con), [-3, 5]);
}

#[test]
fn semaphore_takes_k_permits_at_once() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert_eq!(Sem::new("a", 1, 3).acquire(con), [1, 0]);
    let big = Sem::new("b", 3, 3);
    assert_eq!(big.acquire(con)[0], 0, "3 do not fit beside 1");
    assert_eq!(query::<i64>(con, &["ZCARD", SEM[0]]), 2, "nothing taken");
    assert_eq!(Sem::new("c", 2, 3).acquire(con), [1, 0]);
    assert_eq!(Sem::new("d", 1, 3).acquire(con)[0], 0);
    assert_eq!(Sem::new("c", 2, 3).release(con), 1);
    assert_eq!(Sem::new("a", 1, 3).release(con), 1);
    assert_eq!(big.acquire(con), [1, 0]);
    assert_eq!(Sem::new("d", 1, 3).acquire(con)[0], 0);
}

#[test]
fn semaphore_release_wakes_the_head_that_fits() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["x", "y", "z"]);
    let a = Sem::new("a", 1, 2);
    let b = Sem::new("b", 1, 2);
    assert_eq!(a.acquire(con), [1, 0]);
    assert_eq!(b.acquire(con), [1, 0]);
    let c = Sem::new("c", 2, 2).on("x");
    let d = Sem::new("d", 1, 2).on("y");
    assert_eq!(c.acquire(con)[0], 0);
    assert_eq!(d.acquire(con)[0], 0);
    assert_eq!(a.release(con), 1);
    // one permit free: the head needs two, d behind it is not woken
    assert!(listener.messages().is_empty());
    assert_eq!(d.acquire(con), [0, -2], "behind the head: fair");
    assert_eq!(b.release(con), 2, "released, and woke a waiter");
    assert_eq!(listener.messages(), [("x".to_owned(), "c".to_owned())]);
    assert_eq!(c.acquire(con), [1, 0]);
    assert_eq!(c.release(con), 2, "released, and woke a waiter");
    assert_eq!(listener.messages(), [("y".to_owned(), "d".to_owned())]);
    // several waiters that fit are woken together, grouped by channel
    assert_eq!(d.acquire(con), [1, 0]);
    assert_eq!(Sem::new("e", 1, 2).acquire(con), [1, 0]);
    for waiter in [
        Sem::new("f", 1, 2).on("z"),
        Sem::new("g", 1, 2).on("z"),
        Sem::new("h", 1, 2).on("x"),
    ] {
        assert_eq!(waiter.acquire(con)[0], 0);
    }
    assert_eq!(d.release(con), 2, "released, and woke a waiter");
    assert_eq!(
        Sem::new("e", 1, 2).release(con),
        2,
        "released, and woke a waiter"
    );
    let mut messages = listener.messages();
    messages.sort();
    assert_eq!(
        messages,
        [
            ("z".to_owned(), "f".to_owned()),
            ("z".to_owned(), "f g".to_owned())
        ]
    );
    // woken together, either may enter first
    assert_eq!(Sem::new("g", 1, 2).on("z").acquire(con), [1, 0]);
    assert_eq!(Sem::new("f", 1, 2).on("z").acquire(con), [1, 0]);
    assert_eq!(Sem::new("h", 1, 2).on("x").acquire(con)[0], 0);
    // the last waiter leaving empties the queue
    assert_eq!(Sem::new("h", 1, 2).on("x").leave(con), 1);
    assert_eq!(query::<i64>(con, &["EXISTS", SEM[1], SEM[2]]), 0);
}

#[test]
fn an_unfair_semaphore_release_wakes_those_that_fit_behind_a_big_head() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["x", "y"]);
    let a = Sem::new("a", 1, 3);
    assert_eq!(a.acquire(con), [1, 0]);
    assert_eq!(Sem::new("b", 1, 3).acquire(con), [1, 0]);
    let big = Sem::new("c", 3, 3).on("x");
    let small = Sem::new("d", 2, 3).on("y");
    assert_eq!(big.acquire(con)[0], 0);
    assert_eq!(small.acquire(con)[0], 0);
    assert_eq!(a.release_unfair(con), 2, "released, and woke a waiter");
    // two free: the head needs three and is passed over; d fits
    assert_eq!(listener.messages(), [("y".to_owned(), "d".to_owned())]);
}

#[test]
fn semaphore_leave_wakes_those_behind_a_big_head() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let mut listener = Listener::new(&server, &["x", "y"]);
    assert_eq!(Sem::new("a", 1, 2).acquire(con), [1, 0]);
    let big = Sem::new("b", 2, 2).on("x");
    let small = Sem::new("c", 1, 2).on("y");
    assert_eq!(big.acquire(con)[0], 0);
    assert_eq!(small.acquire(con), [0, -2]);
    assert_eq!(big.leave(con), 1);
    assert_eq!(listener.messages(), [("y".to_owned(), "c".to_owned())]);
    assert_eq!(small.acquire(con), [1, 0]);
}

#[test]
fn expired_semaphore_holder_frees_its_permit() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let short = Sem {
        ttl: SHORT,
        ..Sem::new("a", 1, 1)
    };
    assert_eq!(short.acquire(con), [1, 0]);
    let waiter = Sem::new("b", 1, 1);
    let blocked = waiter.acquire(con);
    assert_eq!(blocked[0], 0);
    assert!(blocked[1] > 0 && blocked[1] <= SHORT as i64, "{blocked:?}");
    poll_until_acquired(|| waiter.acquire(con));
    assert_eq!(short.release(con), 0, "lost");
    let renewed: Vec<i64> = eval(con, RENEW_SHARES, &[SEM[0]], &["1|b", "60000", "1"]);
    assert_eq!(renewed, [1]);
}

// ---------------------------------------------------------------------------
// The lone reader and the gate, at their edges.

/// Every key of the read/write lock `rw` that still exists, with its value
/// when it is the writer key.
fn rw_keys_left(con: &mut Connection) -> Vec<String> {
    let mut left = Vec::new();
    for key in RW {
        if exists(con, key) {
            left.push(key.to_owned());
        }
    }
    if let Some(value) = query::<Option<String>>(con, &["GET", RW[0]]) {
        let pttl: i64 = query(con, &["PTTL", RW[0]]);
        left.push(format!("writer key = {value:?}, PTTL {pttl} ms"));
    }
    left
}

/// A write release with only dead waiters queued: wake() prunes them (the
/// queue goes) before the gate is settled, so no gate stays behind while
/// nobody holds or waits.
#[test]
fn write_release_with_only_dead_waiters_leaves_no_gate() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let w0 = Rw::write("w0");
    assert_eq!(w0.acquire(con), [1, 0]);
    let r1 = Rw::read("r1").on("c");
    assert_eq!(r1.acquire(con)[0], 0);
    // r1's process dies: it stops refreshing its place
    query::<i64>(con, &["ZADD", RW[3], "1", &r1.entry()]);
    assert_eq!(w0.release(con), 1);
    assert_eq!(
        rw_keys_left(con),
        Vec::<String>::new(),
        "nobody holds or waits"
    );
}

/// The same for a lone reader's release.
#[test]
fn lone_reader_release_with_only_dead_waiters_leaves_no_gate() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    assert!(lone_read(con, "r0"));
    let w1 = Rw::write("w1").on("cw");
    assert_eq!(w1.acquire(con)[0], 0);
    // w1's process dies: it stops refreshing its place
    query::<i64>(con, &["ZADD", RW[3], "1", &w1.entry()]);
    assert_eq!(Rw::read("r0").release(con), 1);
    assert_eq!(
        rw_keys_left(con),
        Vec::<String>::new(),
        "nobody holds or waits"
    );
}

/// hold_at_least (a normal release, no crash): the writer key becomes
/// `kept:<token>`, and no script runs when it expires, so the queue exists
/// with neither holder nor gate; the plain read (SET NX with EXISTS queue)
/// sees the queue and gives its share back: it never passes the queued
/// writer.
#[test]
fn a_kept_writers_end_does_not_open_the_plain_read_to_a_queued_writer() {
    plain_read_refused_after_the_writer_key_ends(|con| {
        // w0 releases with hold_at_least = 50 ms
        assert_eq!(eval::<i64>(con, RW_RELEASE, &RW, &["w", "w0", "50"]), 1);
    });
}

/// The same after a writer's key expires (a writer that died or overran
/// its ttl).
#[test]
fn an_expired_writer_does_not_open_the_plain_read_to_a_queued_writer() {
    plain_read_refused_after_the_writer_key_ends(|_| {});
}

/// w0 holds (a short ttl), w1 queues behind it, `end` runs; once w0's key is
/// gone by its ttl alone (no script ran), a plain read is refused.
fn plain_read_refused_after_the_writer_key_ends(end: impl FnOnce(&mut Connection)) {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let w0 = Rw {
        ttl: SHORT,
        ..Rw::write("w0")
    };
    assert_eq!(w0.acquire(con), [1, 0]);
    let w1 = Rw::write("w1").on("cw");
    assert_eq!(w1.acquire(con)[0], 0);
    end(con);
    wait_until("w0's key ended", WAIT, || !exists(con, RW[0]));
    assert!(exists(con, RW[2]), "w1 is still queued");
    assert!(
        !lone_read(con, "r9"),
        "a plain reader passed the queued writer w1"
    );
}

/// A writer whose key expired, released after a script turned the free key
/// into the gate: reported 0 (Expired), not -1 (TakenOver: nobody took it).
#[test]
fn expired_writer_release_under_the_gate_is_expired_not_taken_over() {
    let server = RedisServer::start();
    let con = &mut connect(&server);
    let w0 = Rw {
        ttl: SHORT,
        ..Rw::write("w0")
    };
    assert_eq!(w0.acquire(con), [1, 0]);
    let w1 = Rw::write("w1").on("cw");
    assert_eq!(w1.acquire(con)[0], 0);
    wait_until("w0 expired", WAIT, || !exists(con, RW[0]));
    // a fenced try-reader (script path) is refused and settles the gate
    let fenced = Rw {
        fence: 60_000,
        ..Rw::read("r9")
    };
    assert_eq!(fenced.acquire(con), [0, -2]);
    assert_eq!(
        query::<Option<String>>(con, &["GET", RW[0]]).as_deref(),
        Some("q")
    );
    assert_eq!(w0.release(con), 0, "expired, not taken over");
}
