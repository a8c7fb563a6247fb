//! `renew` across real processes: a renewed lock outlives its ttl, a paused
//! holder takes no further step once its validity is gone, a killed holder's
//! lock frees itself, and a Redis restart or a cut connection never leaves
//! two holders that both believe they hold the lock.

mod common;
use common::*;
use std::time::Duration;

/// The ttl the `renewed` worker mode uses.
const TTL: Duration = Duration::from_secs(1);
const KEY: &str = "lock:{watched}";

fn counter(server: &RedisServer) -> i64 {
    value(&redis(server, &["GET", "effects"]))
        .map(|count| count.parse().unwrap())
        .unwrap_or(0)
}

/// Starts a renewed holder and waits until its body has made `effects` side
/// effects.
fn renewed_holder(server: &RedisServer, effects: i64) -> Process {
    let mut holder = worker(server, &["renewed", "watched", "effects"]);
    assert_eq!(holder.line(LINE_TIMEOUT), "in-body");
    wait_until("the body is working", LINE_TIMEOUT, || {
        counter(server) >= effects
    });
    holder
}

fn key_exists(server: &RedisServer) -> bool {
    redis(server, &["EXISTS", KEY]) == ":1\r\n"
}

#[test]
fn a_renewed_lock_outlives_its_ttl_and_is_free_right_after() {
    let server = RedisServer::start();
    let mut holder = renewed_holder(&server, 1);
    // Another process tries again and again for three ttls and more.
    let millis = (TTL * 3 + TTL / 2).as_millis().to_string();
    let mut contender = worker(&server, &["contend", "watched", &millis]);
    let report = contender.line(LINE_TIMEOUT);
    let tries: u32 = report
        .strip_prefix("tries=")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        tries >= 10,
        "the contender tried only {tries} times: {report}"
    );
    assert!(report.ends_with("acquired=0"), "{report}");

    holder.send("finish");
    assert_eq!(holder.line(LINE_TIMEOUT), "returned");
    assert!(
        !key_exists(&server),
        "the lock must be free right after the body"
    );
    let mut next = worker(&server, &["try", "watched"]);
    assert_eq!(next.line(LINE_TIMEOUT), "acquired");
}

#[test]
fn a_paused_holder_takes_no_step_after_its_validity() {
    let server = RedisServer::start();
    let mut holder = renewed_holder(&server, 3);
    holder.pause();
    // No renewal can come from a stopped process: the key expires.
    wait_until("the paused holder's key expired", LINE_TIMEOUT, || {
        !key_exists(&server)
    });
    let mut second = worker(&server, &["hold", "watched", "30000"]);
    let second_token = second.line(LINE_TIMEOUT);
    let second_token = second_token.strip_prefix("held ").unwrap().to_owned();
    let before_resume = counter(&server);

    holder.resume();
    let outcome = holder.line(LINE_TIMEOUT);
    assert!(
        outcome == "lost NotRenewed" || outcome == "lost TakenOver",
        "the resumed holder must learn it lost the lock: {outcome}"
    );
    let after = counter(&server);
    assert!(
        after <= before_resume + 1,
        "the body went on after resuming: {before_resume} -> {after} side effects"
    );
    // The second holder's lock is untouched by the first's renewals and release.
    assert_eq!(
        value(&redis(&server, &["GET", KEY])).as_deref(),
        Some(second_token.as_str())
    );
    second.send("release");
    assert_eq!(second.line(LINE_TIMEOUT), "released");
}

#[test]
fn a_killed_holders_lock_is_free_within_its_ttl() {
    let server = RedisServer::start();
    let mut holder = renewed_holder(&server, 1);
    holder.kill_hard();
    let pttl: i64 = value(&redis(&server, &["PTTL", KEY]))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        pttl <= TTL.as_millis() as i64,
        "a dead holder's lock must expire within its ttl, PTTL is {pttl} ms"
    );
    wait_until("the dead holder's key expired", LINE_TIMEOUT, || {
        !key_exists(&server)
    });
    let mut next = worker(&server, &["try", "watched"]);
    assert_eq!(next.line(LINE_TIMEOUT), "acquired");
}

#[test]
fn renewal_resumes_after_the_connection_is_cut() {
    let server = RedisServer::start();
    let mut holder = renewed_holder(&server, 1);
    let killed = redis(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed.starts_with(':'), "{killed}");
    // Work worth more than two ttls after the cut, 10 ms a step: only
    // possible if renewals resumed on a new connection.
    let target = counter(&server) + 2 * (TTL.as_millis() as i64) / 10;
    wait_until("the holder worked past two ttls", LINE_TIMEOUT, || {
        counter(&server) >= target
    });
    let mut other = worker(&server, &["try", "watched"]);
    assert_eq!(other.line(LINE_TIMEOUT), "busy");
    holder.send("finish");
    assert_eq!(holder.line(LINE_TIMEOUT), "returned");
}

#[test]
fn a_redis_restart_after_a_ttl_leaves_one_holder() {
    let mut server = RedisServer::start();
    let port = server.port();
    let mut holder = renewed_holder(&server, 1);
    server.kill();
    // Renewals cannot be confirmed: the holder stops within its validity.
    assert_eq!(holder.line(LINE_TIMEOUT), "lost NotRenewed");
    // Only then does Redis come back (the "delayed restart" of the docs),
    // and another instance takes the lock.
    let server = RedisServer::start_on(port).expect("restart on the same port");
    let mut second = worker(&server, &["try", "watched"]);
    assert_eq!(second.line(LINE_TIMEOUT), "acquired");
}

#[test]
fn an_immediate_restart_that_lost_the_key_is_reported() {
    let mut server = RedisServer::start();
    let port = server.port();
    let mut holder = renewed_holder(&server, 1);
    server.kill();
    let _server = RedisServer::start_on(port).expect("restart on the same port");
    // The restarted Redis has no key: the next renewal finds it gone while
    // the holder's validity still had time, `Deleted` (or, if reconnecting
    // takes too long, the validity runs out first).
    let outcome = holder.line(LINE_TIMEOUT);
    assert!(
        outcome == "lost Deleted" || outcome == "lost NotRenewed",
        "{outcome}"
    );
}
