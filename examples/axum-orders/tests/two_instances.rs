//! Two instances of the service, one Redis, 40 concurrent settlements of one
//! order split across both: the lock keeps the read-modify-write whole, so
//! the balance counts every request that got 200, and nothing else. Both
//! instances settle some (a holder passes the lock within its process at
//! most 4 times in a row while the other's requests wait in Redis); a
//! request that waited 2 s gets 423.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use test_support::{Process, RedisServer};

const REQUESTS: usize = 40;
const ORDER: u64 = 7;

/// Starts one instance on a free port and returns it with its port.
fn start_instance(redis_url: &str) -> (Process, u16) {
    // `env` execs the service in its place, with PORT=0 for a free port.
    let mut instance = Process::spawn(
        "env",
        &["PORT=0", env!("CARGO_BIN_EXE_axum-orders")],
        Some(redis_url),
    );
    let line = instance.line(Duration::from_secs(10));
    let port = line
        .strip_prefix("listening on ")
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("expected `listening on <port>`, got {line:?}"));
    (instance, port)
}

/// One HTTP/1.1 POST on a fresh connection; returns the status and the body.
fn post(port: u16, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("send request");
    // `Connection: close`: the response ends where the connection does.
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read response (10 s timeout)");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The `balance` field of a `{"id":..,"balance":..}` body.
fn balance_in(body: &str) -> i64 {
    body.split("\"balance\":")
        .nth(1)
        .and_then(|rest| rest.trim_end_matches('}').parse().ok())
        .unwrap_or_else(|| panic!("no balance in {body:?}"))
}

#[test]
fn concurrent_settlements_across_two_instances_are_not_lost() {
    let redis = RedisServer::start();
    let (_a, port_a) = start_instance(&redis.url());
    let (_b, port_b) = start_instance(&redis.url());

    let path = format!("/orders/{ORDER}/settle");
    let start = Arc::new(Barrier::new(REQUESTS));
    let requests: Vec<_> = (0..REQUESTS)
        .map(|n| {
            let port = if n % 2 == 0 { port_a } else { port_b };
            let (start, path) = (Arc::clone(&start), path.clone());
            std::thread::spawn(move || {
                start.wait();
                (port, post(port, &path))
            })
        })
        .collect();
    let answered: Vec<(u16, (u16, String))> = requests
        .into_iter()
        .map(|request| request.join().expect("request thread"))
        .collect();
    for port in [port_a, port_b] {
        assert!(
            answered
                .iter()
                .any(|(to, (status, _))| *to == port && *status == 200),
            "no request to the instance on port {port} settled: {answered:?}"
        );
    }
    let responses: Vec<(u16, String)> =
        answered.into_iter().map(|(_, response)| response).collect();

    for (status, body) in &responses {
        assert!(
            *status == 200 || *status == 423,
            "unexpected {status}: {body}"
        );
    }
    let mut balances: Vec<i64> = responses
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, body)| balance_in(body))
        .collect();
    let settled = balances.len() as i64;

    // Each settlement saw the one before it: the balances returned are
    // exactly 1..=settled, and Redis holds the last.
    balances.sort_unstable();
    assert_eq!(balances, (1..=settled).collect::<Vec<_>>());
    let stored = redis
        .command(&["GET", &format!("balance:{ORDER}")])
        .unwrap();
    assert_eq!(
        stored,
        format!("${}\r\n{settled}\r\n", settled.to_string().len())
    );
}
