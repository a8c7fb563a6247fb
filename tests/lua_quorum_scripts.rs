//! The Lua scripts one node of a quorum (RedLock) runs, driven directly with
//! EVAL against a private redis-server: the line of waiters ordered by
//! tickets (the same on every node, so every node names the same first
//! waiter), which attempt may replace which, and whom a release, a give-back
//! or a leave wakes.

mod common;
use common::*;

use redis::{Connection, FromRedisValue, Value};

/// A script: the helper files it is preceded by, then its own file.
macro_rules! script {
    ($($file:literal),+) => {
        concat!($(include_str!(concat!("../lock-runtime/src/backend/lua/", $file))),+)
    };
}

const ACQUIRE: &str = script!("publish.lua", "tickets.lua", "quorum_acquire.lua");
const RELEASE: &str = script!(
    "quorum_release.lua",
    "publish.lua",
    "tickets.lua",
    "quorum_release_wake.lua"
);
const LEAVE: &str = script!("publish.lua", "tickets.lua", "quorum_leave.lua");

/// The lock `q`: lock, fence, tickets, waiters.
const KEYS: [&str; 4] = [
    "lock:{q}",
    "lock:{q}:fence",
    "lock:{q}:tickets",
    "lock:{q}:waiters",
];

fn connect(server: &RedisServer) -> Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn eval<T: FromRedisValue>(con: &mut Connection, script: &str, args: &[&str]) -> T {
    redis::cmd("EVAL")
        .arg(script)
        .arg(KEYS.len())
        .arg(&KEYS[..])
        .arg(args)
        .query(con)
        .unwrap_or_else(|error| panic!("EVAL {args:?}: {error}"))
}

/// One attempt: `value` `<token>|q<n>`, joining the line as `member` with
/// `ticket` (0: the node's clock), deferring to the first waiter when
/// `respect`. The reply as numbers.
fn attempt(
    con: &mut Connection,
    value: &str,
    member: &str,
    ticket: u64,
    respect: bool,
) -> Vec<i64> {
    let join = if member.is_empty() { "0" } else { "1" };
    let respect = if respect { "1" } else { "0" };
    eval(
        con,
        ACQUIRE,
        &[
            value,
            "30000",
            "0",
            "30000",
            join,
            respect,
            member,
            "0",
            &ticket.to_string(),
            "0",
        ],
    )
}

fn held(con: &mut Connection) -> Option<String> {
    redis::cmd("GET").arg(KEYS[0]).query(con).unwrap()
}

/// The waiters in line, first first.
fn line(con: &mut Connection) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(KEYS[2])
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap()
}

/// Every node orders its waiters by the ticket each sends, not by arrival:
/// a waiter that arrives later with a smaller ticket is first, and a free
/// lock goes only to the first (or to a waiter that does not defer).
#[test]
fn the_line_is_ordered_by_tickets_and_a_free_lock_goes_to_the_first() {
    let server = RedisServer::start();
    let mut con = connect(&server);
    redis::cmd("SET")
        .arg(KEYS[0])
        .arg("holder|q00000001")
        .query::<()>(&mut con)
        .unwrap();
    // Busy: both join, the later arrival with the smaller ticket.
    let late = attempt(&mut con, "b|q00000001", "ch|b", 1_000, true);
    assert_eq!((late[0], late[2], late[3]), (0, 1_000, 1));
    let early = attempt(&mut con, "a|q00000001", "ch|a", 500, true);
    assert_eq!((early[0], early[2], early[3]), (0, 500, 1));
    assert_eq!(line(&mut con), ["ch|a", "ch|b"]);
    redis::cmd("DEL")
        .arg(KEYS[0])
        .query::<()>(&mut con)
        .unwrap();
    // Free: b is not first, so it is refused (and told the lock is free);
    // a try defers too; a is granted and stays in line until it leaves.
    let refused = attempt(&mut con, "b|q00000002", "ch|b", 1_000, true);
    assert_eq!((refused[0], refused[1], refused[3]), (0, -2, 0));
    let tried = attempt(&mut con, "t|q00000000", "", 0, true);
    assert_eq!((tried[0], tried[1]), (0, -2));
    let granted = attempt(&mut con, "a|q00000002", "ch|a", 500, true);
    assert_eq!(granted[0], 1);
    assert_eq!(held(&mut con).as_deref(), Some("a|q00000002"));
    assert_eq!(line(&mut con), ["ch|a", "ch|b"]);
    let _: i64 = eval(&mut con, LEAVE, &["ch|a"]);
    assert_eq!(line(&mut con), ["ch|b"]);
    // A waiter that does not defer (first on a majority elsewhere) takes a
    // free lock whoever is first here.
    let _ = attempt(&mut con, "c|q00000001", "ch|c", 100, true);
    assert_eq!(line(&mut con), ["ch|c", "ch|b"]);
    let _: i64 = eval(&mut con, RELEASE, &["a", ""]);
    let bypass = attempt(&mut con, "b|q00000003", "ch|b", 1_000, false);
    assert_eq!(bypass[0], 1);
    // The value is the attempt's own, with no wake mark.
    assert_eq!(held(&mut con).as_deref(), Some("b|q00000003"));
}

/// A waiter's later attempt replaces its own earlier attempt's grant (that
/// attempt was given up, its give-back on its way), but a call of an earlier
/// attempt that lands late never replaces a later attempt's grant, and an
/// attempt of another holder never replaces either.
#[test]
fn a_later_attempt_replaces_an_earlier_one_never_the_reverse() {
    let server = RedisServer::start();
    let mut con = connect(&server);
    assert_eq!(attempt(&mut con, "w|q00000002", "ch|w", 1, true)[0], 1);
    let late = attempt(&mut con, "w|q00000001", "ch|w", 1, true);
    assert_eq!(late[0], 0, "an earlier attempt undid a later grant");
    assert!(late[1] > 0, "held, not free: {late:?}");
    assert_eq!(held(&mut con).as_deref(), Some("w|q00000002"));
    assert_eq!(attempt(&mut con, "w|q0000000a", "ch|w", 1, true)[0], 1);
    assert_eq!(held(&mut con).as_deref(), Some("w|q0000000a"));
    let other = attempt(&mut con, "x|q000000ff", "ch|x", 0, false);
    assert_eq!(other[0], 0);
    assert_eq!(held(&mut con).as_deref(), Some("w|q0000000a"));
    // The give-back of the earlier attempt deletes nothing of the later.
    let given_back: i64 = eval(&mut con, RELEASE, &["w|q00000002", "ch|w"]);
    assert_eq!(given_back, -1);
    assert_eq!(held(&mut con).as_deref(), Some("w|q0000000a"));
    // The holder's release (its token) deletes whichever attempt holds.
    let released: i64 = eval(&mut con, RELEASE, &["w", ""]);
    assert!(released >= 1);
    assert_eq!(held(&mut con), None);
}

/// A release wakes the first waiter in line; a failed attempt's give-back
/// wakes the first waiter too, unless that is the giver itself (it would
/// only wake itself up to try again at once, in a loop while the lock is
/// held elsewhere); a leave of the first waiter wakes the next when the lock
/// is free.
#[test]
fn releases_give_backs_and_leaves_wake_the_first_waiter_but_not_the_giver() {
    let server = RedisServer::start();
    let mut con = connect(&server);
    let mut listener = connect(&server);
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("ch").unwrap();
    pubsub.set_read_timeout(Some(LINE_TIMEOUT)).unwrap();
    let mut woken = move || -> String { pubsub.get_message().unwrap().get_payload().unwrap() };
    let _ = attempt(&mut con, "h|q00000001", "", 0, true);
    let _ = attempt(&mut con, "a|q00000001", "ch|a", 1, true);
    let _ = attempt(&mut con, "b|q00000001", "ch|b", 2, true);
    // The holder's release wakes a, the first in line.
    let released: i64 = eval(&mut con, RELEASE, &["h", ""]);
    assert_eq!(released, 2);
    assert_eq!(woken(), "a");
    // a's attempt is granted, then given back (it failed elsewhere): a is
    // still first, so nobody is woken.
    assert_eq!(attempt(&mut con, "a|q00000002", "ch|a", 1, true)[0], 1);
    let given_back: i64 = eval(&mut con, RELEASE, &["a|q00000002", "ch|a"]);
    assert_eq!(given_back, 1, "the giver woke itself");
    // b takes it bypassing a, and gives it back: a is woken.
    assert_eq!(attempt(&mut con, "b|q00000002", "ch|b", 2, false)[0], 1);
    let given_back: i64 = eval(&mut con, RELEASE, &["b|q00000002", "ch|b"]);
    assert_eq!(given_back, 2);
    assert_eq!(woken(), "a");
    // a leaves while the lock is free: b is told.
    let _: i64 = eval(&mut con, LEAVE, &["ch|a"]);
    assert_eq!(woken(), "b");
    assert_eq!(line(&mut con), ["ch|b"]);
}

/// A waiter that stopped refreshing its place is not first any more: the
/// scripts drop it from the front of the line once its deadline passed on
/// the node's clock.
#[test]
fn an_expired_place_is_dropped_from_the_front_of_the_line() {
    let server = RedisServer::start();
    let mut con = connect(&server);
    let _ = attempt(&mut con, "h|q00000001", "", 0, true);
    let _ = attempt(&mut con, "b|q00000001", "ch|b", 2, true);
    // a joins first in line with a place that lasts 1 ms.
    let joined: Vec<i64> = eval(
        &mut con,
        ACQUIRE,
        &[
            "a|q00000001",
            "30000",
            "0",
            "1",
            "1",
            "1",
            "ch|a",
            "0",
            "1",
            "0",
        ],
    );
    assert_eq!(joined[3], 1);
    let deadline: f64 = redis::cmd("ZSCORE")
        .arg(KEYS[3])
        .arg("ch|a")
        .query(&mut con)
        .unwrap();
    wait_until("the node's clock passes a's deadline", LINE_TIMEOUT, || {
        let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
        (seconds * 1000 + micros / 1000) as f64 > deadline
    });
    let released: i64 = eval(&mut con, RELEASE, &["h", ""]);
    assert_eq!(released, 2, "b is woken");
    assert_eq!(line(&mut con), ["ch|b"]);
    let reply: Value = redis::cmd("EXISTS").arg(KEYS[0]).query(&mut con).unwrap();
    assert_eq!(reply, Value::Int(0));
}

/// A call that reaches the node after its `not after` time (on the node's
/// clock: it waited in a connection, or behind the node while it was
/// stopped, and its client no longer waits for the answer) is refused with
/// nothing written: no grant that would hold the node for a ttl for nobody,
/// no place in line for a waiter that may be gone.
#[test]
fn a_call_that_arrives_too_late_takes_nothing() {
    let server = RedisServer::start();
    let mut con = connect(&server);
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now = seconds * 1_000_000 + micros;
    let late: Vec<i64> = eval(
        &mut con,
        ACQUIRE,
        &[
            "w|q00000001",
            "30000",
            "0",
            "30000",
            "1",
            "1",
            "ch|w",
            "0",
            "5",
            &(now - 1).to_string(),
        ],
    );
    assert_eq!((late[0], late[1]), (0, -3), "{late:?}");
    assert_eq!(held(&mut con), None);
    assert!(line(&mut con).is_empty());
    // In time, the same call takes the free lock.
    let in_time: Vec<i64> = eval(
        &mut con,
        ACQUIRE,
        &[
            "w|q00000001",
            "30000",
            "0",
            "30000",
            "1",
            "1",
            "ch|w",
            "0",
            "5",
            &(now + 60_000_000).to_string(),
        ],
    );
    assert_eq!(in_time[0], 1);
}
