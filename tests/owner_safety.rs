//! A holder whose ttl passed while another instance took the lock releases
//! late and leaves the other's lock in place.

mod common;
use common::*;
use std::time::Duration;

fn wait_for_expiry(server: &RedisServer, key: &str) {
    wait_until(
        "the first holder's key expired",
        Duration::from_secs(10),
        || redis(server, &["EXISTS", key]) == ":0\r\n",
    );
}

fn assert_held_by(server: &RedisServer, key: &str, token: &str) {
    assert_eq!(value(&redis(server, &["GET", key])).as_deref(), Some(token));
    let pttl: i64 = value(&redis(server, &["PTTL", key]))
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl > 0, "the second holder's key lost its expiry: {pttl}");
}

#[test]
fn late_manual_release_leaves_the_new_holders_lock() {
    let server = RedisServer::start();
    let key = "lock:{report}";
    let mut first = worker(&server, &["hold", "report", "200"]);
    let first_token = first.line(LINE_TIMEOUT);
    wait_for_expiry(&server, key);

    let mut second = worker(&server, &["hold", "report", "30000"]);
    let second_token = second.line(LINE_TIMEOUT);
    let second_token = second_token.strip_prefix("held ").unwrap();
    assert_ne!(first_token.strip_prefix("held ").unwrap(), second_token);

    first.send("release");
    assert_eq!(first.line(LINE_TIMEOUT), "lost TakenOver");
    assert_held_by(&server, key, second_token);

    second.send("release");
    assert_eq!(second.line(LINE_TIMEOUT), "released");
    assert_eq!(redis(&server, &["EXISTS", key]), ":0\r\n");
}

#[test]
fn late_release_of_an_expired_lock_reports_it() {
    let server = RedisServer::start();
    let mut holder = worker(&server, &["hold", "nightly", "100"]);
    holder.line(LINE_TIMEOUT);
    wait_for_expiry(&server, "lock:{nightly}");
    holder.send("release");
    assert_eq!(holder.line(LINE_TIMEOUT), "lost Expired");
}

#[test]
fn attribute_body_outliving_its_ttl_leaves_the_new_holders_lock() {
    let server = RedisServer::start();
    let key = "lock:{invoice}";
    let mut slow = worker(&server, &["slow-holder", "invoice"]);
    assert_eq!(slow.line(LINE_TIMEOUT), "in-body");
    wait_for_expiry(&server, key);

    let mut second = worker(&server, &["hold", "invoice", "30000"]);
    let second_token = second.line(LINE_TIMEOUT);
    let second_token = second_token.strip_prefix("held ").unwrap().to_owned();

    slow.send("finish");
    assert_eq!(slow.line(LINE_TIMEOUT), "returned");
    assert_held_by(&server, key, &second_token);
    second.send("release");
    assert_eq!(second.line(LINE_TIMEOUT), "released");
}
