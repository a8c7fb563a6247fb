//! `wire_floor`: what a connection written to from the caller's task would
//! save over the `redis` crate's multiplexed connection, on W1's pattern
//! over 5 local nodes (`SET NX PX` on each, then a compare-and-delete
//! `EVALSHA` on each, in sequence). The multiplexed connection hands each
//! call to its driver task and wakes the caller back with the reply; the
//! prototype writes from the caller's task, and a reader task per
//! connection completes the replies in order. It is a measuring stick for
//! docs/benchmarks.md ("Issue 40, fourth pass"), not a transport: no
//! timeouts, no reconnection, no TLS, replies of one line or one bulk
//! string only.
//!
//! ```text
//! cargo run --release -p lock-bench --bin wire_floor -- [--pairs 3000] [--rounds 5]
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use test_support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::oneshot;

const NODES: usize = 5;

const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                                  return redis.call('DEL', KEYS[1]) end return 0";

fn option(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[path = "../cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_time;

/// One command in RESP.
fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

type Waiting = Arc<Mutex<VecDeque<oneshot::Sender<Vec<u8>>>>>;

/// A connection its callers write to; a reader task answers them in order.
struct CallerWritten {
    write: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Waiting,
}

impl CallerWritten {
    async fn open(port: u16) -> CallerWritten {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (read, write) = stream.into_split();
        let waiting = Waiting::default();
        tokio::spawn(read_replies(read, Arc::clone(&waiting)));
        CallerWritten {
            write: tokio::sync::Mutex::new(write),
            waiting,
        }
    }

    async fn call(&self, command: &[u8]) -> Vec<u8> {
        let (sender, reply) = oneshot::channel();
        {
            let mut write = self.write.lock().await;
            self.waiting.lock().expect("queue").push_back(sender);
            write.write_all(command).await.expect("write");
        }
        reply.await.expect("reply")
    }
}

/// Reads replies (one line, or a bulk string) and hands each to the
/// oldest caller waiting.
async fn read_replies(mut read: tokio::net::tcp::OwnedReadHalf, waiting: Waiting) {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(count) = read.read(&mut chunk).await else {
            return;
        };
        if count == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..count]);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\r\n") {
            let mut length = end + 2;
            if buffer[0] == b'$' && &buffer[..end] != b"$-1" {
                let bytes: usize = std::str::from_utf8(&buffer[1..end])
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .expect("a bulk string's length");
                if buffer.len() < length + bytes + 2 {
                    break;
                }
                length += bytes + 2;
            }
            let reply: Vec<u8> = buffer.drain(..length).collect();
            let sender = waiting.lock().expect("queue").pop_front();
            if let Some(sender) = sender {
                let _ = sender.send(reply);
            }
        }
    }
}

async fn multiplexed_pair(connections: &[MultiplexedConnection], sha: &str, value: &str) {
    let set = connections.iter().map(|connection| {
        let mut connection = connection.clone();
        async move {
            let _: Option<String> = redis::cmd("SET")
                .arg("k")
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(&mut connection)
                .await
                .expect("SET");
        }
    });
    futures_util::future::join_all(set).await;
    let release = connections.iter().map(|connection| {
        let mut connection = connection.clone();
        async move {
            let _: i64 = redis::cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg("k")
                .arg(value)
                .query_async(&mut connection)
                .await
                .expect("EVALSHA");
        }
    });
    futures_util::future::join_all(release).await;
}

async fn caller_written_pair(connections: &[CallerWritten], sha: &str, value: &str) {
    let set = encode(&[b"SET", b"k", value.as_bytes(), b"NX", b"PX", b"10000"]);
    futures_util::future::join_all(connections.iter().map(|connection| connection.call(&set)))
        .await;
    let release = encode(&[b"EVALSHA", sha.as_bytes(), b"1", b"k", value.as_bytes()]);
    futures_util::future::join_all(
        connections
            .iter()
            .map(|connection| connection.call(&release)),
    )
    .await;
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pairs = option(&args, "--pairs", 3000);
    let rounds = option(&args, "--rounds", 5);
    let nodes: Vec<RedisServer> = (0..NODES).map(|_| RedisServer::start()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut multiplexed = Vec::new();
        let mut written = Vec::new();
        let mut sha = String::new();
        for node in &nodes {
            let client = redis::Client::open(format!("redis://127.0.0.1:{}", node.port()))
                .expect("client");
            let mut connection = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            sha = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(COMPARE_AND_DELETE)
                .query_async(&mut connection)
                .await
                .expect("SCRIPT LOAD");
            multiplexed.push(connection);
            written.push(CallerWritten::open(node.port()).await);
        }
        let (mut rates, mut cpus) = (Vec::new(), Vec::new());
        println!("W1's pattern over {NODES} local nodes, {pairs} pairs per round, {rounds} rounds each, alternated");
        for round in 0..rounds {
            let mut measured = [(0.0, 0.0); 2];
            for (kind, slot) in measured.iter_mut().enumerate() {
                let (started, cpu) = (Instant::now(), cpu_time());
                for pair in 0..pairs {
                    let value = format!("v{round}-{kind}-{pair}");
                    if kind == 0 {
                        multiplexed_pair(&multiplexed, &sha, &value).await;
                    } else {
                        caller_written_pair(&written, &sha, &value).await;
                    }
                }
                let seconds = started.elapsed().as_secs_f64();
                let used = (cpu_time() - cpu).as_secs_f64();
                *slot = (pairs as f64 / seconds, used * 1e6 / pairs as f64);
            }
            let [(mux_rate, mux_cpu), (own_rate, own_cpu)] = measured;
            println!(
                "round {round}: redis crate {mux_rate:.0} pairs/s, {mux_cpu:.0} µs CPU/pair; \
                 caller-written {own_rate:.0} pairs/s, {own_cpu:.0} µs CPU/pair"
            );
            rates.push(own_rate / mux_rate);
            cpus.push(own_cpu / mux_cpu);
        }
        println!(
            "caller-written × the redis crate's multiplexed connection, median of {rounds} \
             rounds: pairs/s {:.2}, client CPU per pair {:.2}",
            median(rates),
            median(cpus)
        );
    });
}
