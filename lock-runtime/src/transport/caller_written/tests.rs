//! The caller-written connection against real servers: the values the
//! `redis` crate's own connection gives, the login, and what breaks it.

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::MultiplexedConnection;
use test_support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn client(url: &str) -> redis::Client {
    redis::Client::open(url).expect("a valid URL")
}

async fn both(url: &str) -> (CallerWritten, MultiplexedConnection) {
    let node = client(url);
    let written = CallerWritten::open(&node, Some(Duration::from_secs(10)))
        .await
        .expect("opened");
    let multiplexed = node
        .get_multiplexed_async_connection()
        .await
        .expect("opened");
    (written, multiplexed)
}

fn cmd(args: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd
}

#[tokio::test]
async fn replies_are_the_crate_connections_values() {
    // The same calls to two servers, one through each connection.
    let (ours, theirs) = (RedisServer::start(), RedisServer::start());
    let (written, _) = both(&ours.url()).await;
    let (_, mut multiplexed) = both(&theirs.url()).await;
    let big = vec![b'x'; 300_000];
    let calls: Vec<Vec<&[u8]>> = vec![
        vec![b"SET", b"k", b"v"],
        vec![b"GET", b"k"],
        vec![b"GET", b"missing"],
        vec![b"INCR", b"counter"],
        vec![b"LPUSH", b"k", b"a"],
        vec![b"SET", b"big", &big],
        vec![b"GET", b"big"],
        vec![
            b"EVAL",
            b"return {1, 'two', {false, redis.error_reply('ERR inner')}, redis.status_reply('FINE')}",
            b"0",
        ],
        vec![b"EVAL", b"return redis.error_reply('CUSTOM failed here')", b"0"],
        vec![b"NOSUCHCOMMAND"],
        vec![b"HSET", b"h", b"f", b"1", b"g", b"2"],
        vec![b"HGETALL", b"h"],
    ];
    for call in &calls {
        let command = cmd(call);
        let ours = written.send(&command).await.expect("an answer");
        let theirs = multiplexed
            .send_packed_command(&command)
            .await
            .expect("an answer");
        assert_eq!(ours, theirs, "{:?}", String::from_utf8_lossy(call[0]));
    }

    let mut pipeline = redis::pipe();
    pipeline
        .cmd("SET")
        .arg("p")
        .arg("1")
        .cmd("INCR")
        .arg("p")
        .cmd("LPUSH")
        .arg("p")
        .arg("x")
        .cmd("GET")
        .arg("p");
    for (offset, count) in [(0, 4), (1, 2), (3, 1)] {
        let ours = written.send_pipeline(&pipeline, offset, count).await;
        let theirs = multiplexed
            .send_packed_commands(&pipeline, offset, count)
            .await;
        assert_eq!(ours.expect("answers"), theirs.expect("answers"));
    }

    let mut transaction = redis::pipe();
    transaction
        .atomic()
        .cmd("INCR")
        .arg("t")
        .cmd("INCR")
        .arg("t");
    let ours = written.send_pipeline(&transaction, 3, 1).await;
    let theirs = multiplexed.send_packed_commands(&transaction, 3, 1).await;
    assert_eq!(ours.expect("answers"), theirs.expect("answers"));
}

#[tokio::test]
async fn it_logs_in_and_uses_the_urls_database() {
    let server = RedisServer::start();
    server
        .command(&["ACL", "SETUSER", "locker", "on", ">secret", "~*", "+@all"])
        .expect("a user");
    server
        .command(&["CONFIG", "SET", "requirepass", "defaultpass"])
        .expect("a password");
    let port = server.port();

    let (written, mut multiplexed) =
        both(&format!("redis://locker:secret@127.0.0.1:{port}/3")).await;
    assert_eq!(written.db(), 3);
    written
        .send(redis::cmd("SET").arg("in-three").arg("yes"))
        .await
        .expect("set");
    let read: Option<String> = redis::cmd("GET")
        .arg("in-three")
        .query_async(&mut multiplexed)
        .await
        .expect("read");
    assert_eq!(read.as_deref(), Some("yes"), "written in database 3");
    let whoami = written.send(&redis::cmd("ACL").arg("WHOAMI").clone()).await;
    assert_eq!(
        whoami.expect("answer"),
        Value::BulkString(b"locker".to_vec())
    );
    let info = written
        .send(redis::cmd("CLIENT").arg("INFO"))
        .await
        .expect("answer");
    let info: String = redis::from_redis_value(info).expect("text");
    // Redis 7.2 and later show the library's name.
    if info.contains("lib-name=") {
        assert!(info.contains("lib-name=lock-runtime"), "{info}");
    }

    // The password alone logs in as the default user.
    let (written, _) = both(&format!("redis://:defaultpass@127.0.0.1:{port}")).await;
    let whoami = written.send(&redis::cmd("ACL").arg("WHOAMI").clone()).await;
    assert_eq!(
        whoami.expect("answer"),
        Value::BulkString(b"default".to_vec())
    );

    for url in [
        format!("redis://locker:wrong@127.0.0.1:{port}"),
        format!("redis://:wrong@127.0.0.1:{port}"),
    ] {
        let refused = CallerWritten::open(&client(&url), Some(Duration::from_secs(10)))
            .await
            .err()
            .expect("a wrong password is refused");
        assert_eq!(refused.kind(), ErrorKind::AuthenticationFailed, "{refused}");
        assert!(!refused.to_string().contains("wrong"), "{refused}");
    }

    let refused = CallerWritten::open(
        &client(&format!("redis://:defaultpass@127.0.0.1:{port}/99")),
        Some(Duration::from_secs(10)),
    )
    .await
    .err()
    .expect("database 99 does not exist");
    assert!(refused.to_string().contains("switch database"), "{refused}");
}

/// Whether the server shows a client blocked in `command`.
fn blocked_in(server: &RedisServer, command: &str) -> bool {
    server
        .command(&["CLIENT", "LIST"])
        .map(|list| list.contains(&format!("cmd={command}")))
        .unwrap_or(false)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not seen within 10 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_fails_the_calls_waiting_and_every_later_one() {
    let mut server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    let waiting = tokio::spawn({
        let written = written.clone();
        async move { written.send(redis::cmd("BLPOP").arg("never").arg(0)).await }
    });
    tokio::task::block_in_place(|| wait_for("BLPOP blocked", || blocked_in(&server, "blpop")));
    server.kill();
    let failed = waiting.await.expect("joined").expect_err("the server died");
    assert!(failed.is_io_error(), "{failed}");
    assert!(written.is_broken());
    let later = written
        .send(&redis::cmd("PING"))
        .await
        .expect_err("it broke");
    assert!(later.is_io_error(), "{later}");
}

/// Polls `call` `polls` times (no waker: nothing wakes it), then drops
/// it: its output if it finished by then.
fn poll_then_give_up<F: std::future::Future>(call: F, polls: usize) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let mut context = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    for _ in 0..polls {
        if let std::task::Poll::Ready(output) = call.as_mut().poll(&mut context) {
            return Some(output);
        }
    }
    None
}

/// A call given up before its reply on a busy connection (another call
/// waits for its reply), after one poll or two (its command in the
/// outbox, or written by the connection's task): the connection stays in step, each
/// call gets its own reply.
#[tokio::test]
async fn a_call_given_up_before_its_reply_leaves_the_connection_in_step() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    written
        .send(redis::cmd("SET").arg("first").arg("1"))
        .await
        .expect("set");
    written
        .send(redis::cmd("SET").arg("second").arg("2"))
        .await
        .expect("set");
    for polls in [1, 2] {
        // Written at its first poll (the connection was idle); on this
        // one-thread runtime its reply cannot have been read yet.
        let get_first = redis::cmd("GET").arg("first").clone();
        let mut first = std::pin::pin!(written.send(&get_first));
        let mut context = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        assert!(first.as_mut().poll(&mut context).is_pending());
        let get_second = redis::cmd("GET").arg("second").clone();
        let given_up = poll_then_give_up(written.send(&get_second), polls);
        assert!(
            given_up.is_none(),
            "given up before its reply: {given_up:?}"
        );
        assert!(!written.is_broken());
        assert_eq!(
            first.await.expect("an answer"),
            Value::BulkString(b"1".to_vec())
        );
        let second = written
            .send(redis::cmd("GET").arg("second"))
            .await
            .expect("an answer");
        assert_eq!(second, Value::BulkString(b"2".to_vec()), "its own reply");
    }
}

/// A call given up in the middle of its command's write: the rest is
/// written by the connection's task, whole, and the connection stays in step (as
/// the crate's connection writes a call given up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_in_the_middle_of_its_write_is_written_whole() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    // A stopped server reads nothing: 64 MB cannot all go into the
    // socket's buffers at once.
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(server.pid() as i32, libc::SIGSTOP) };
    let value = vec![b'x'; 64 << 20];
    // The connection is idle: the first poll writes what the socket takes
    // and leaves the rest to the connection's task.
    let given_up = poll_then_give_up(written.send(redis::cmd("SET").arg("big").arg(&value)), 1);
    // The connection's task writes the rest, and cannot finish while the
    // server is stopped.
    let left = written.0.line.lock().writer == Writer::Driver;
    // SAFETY: as above.
    unsafe { libc::kill(server.pid() as i32, libc::SIGCONT) };
    assert!(given_up.is_none(), "given up in the middle of its write");
    assert!(left, "part of the command was left to write");
    let length = written
        .send(redis::cmd("STRLEN").arg("big"))
        .await
        .expect("an answer");
    assert_eq!(
        length,
        Value::Int(64 << 20),
        "written whole, then this call"
    );
    assert!(!written.is_broken());
}

/// A call on a busy connection that is polled once and then not again
/// for a while (its caller awaits something else) holds no other call up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_not_polled_again_holds_no_other_call_up() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    let _blpop = tokio::spawn({
        let written = written.clone();
        async move { written.send(redis::cmd("BLPOP").arg("never").arg(0)).await }
    });
    tokio::task::block_in_place(|| wait_for("BLPOP blocked", || blocked_in(&server, "blpop")));
    // The BLPOP blocks this connection's later commands in the server:
    // unblock it once the parked call and the other are both sent.
    let ping = redis::cmd("PING");
    let mut parked = Box::pin(written.send(&ping));
    let mut context = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    assert!(parked.as_mut().poll(&mut context).is_pending());
    let other = tokio::spawn({
        let written = written.clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                written.send(&redis::cmd("ECHO").arg("other").clone()),
            )
            .await
        }
    });
    server.command(&["LPUSH", "never", "x"]).expect("pushed");
    let other = other.await.expect("joined");
    assert_eq!(
        other.expect("within 10 s").expect("an answer"),
        Value::BulkString(b"other".to_vec())
    );
    drop(parked);
}

/// A call made from a runtime that is then shut down, on a connection
/// another runtime reads: later calls are answered.
#[test]
fn a_runtime_shut_down_with_a_call_in_flight_leaves_the_connection_working() {
    let server = RedisServer::start();
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let written = main.block_on(async {
        CallerWritten::open(&client(&server.url()), Some(Duration::from_secs(10)))
            .await
            .expect("opened")
    });
    let blpop = main.spawn({
        let written = written.clone();
        async move { written.send(redis::cmd("BLPOP").arg("never").arg(0)).await }
    });
    wait_for("BLPOP blocked", || blocked_in(&server, "blpop"));
    {
        let secondary = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        secondary.block_on(async {
            let ping = redis::cmd("PING");
            // Added to the outbox of the busy connection, then dropped
            // with its runtime.
            assert!(poll_then_give_up(written.send(&ping), 1).is_none());
        });
    }
    server.command(&["LPUSH", "never", "x"]).expect("pushed");
    let later = main.block_on(async {
        assert!(blpop.await.expect("joined").is_ok());
        tokio::time::timeout(
            Duration::from_secs(10),
            written.send(&redis::cmd("ECHO").arg("later").clone()),
        )
        .await
    });
    assert_eq!(
        later.expect("within 10 s").expect("an answer"),
        Value::BulkString(b"later".to_vec())
    );
}

/// A connection whose every handle is dropped closes, even with commands
/// left to write to a stopped server: its tasks end with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_with_commands_left_to_write_closes() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(server.pid() as i32, libc::SIGSTOP) };
    let value = vec![b'x'; 64 << 20];
    assert!(poll_then_give_up(written.send(redis::cmd("SET").arg("big").arg(&value)), 1).is_none());
    let (line, weak) = (Arc::clone(&written.0.line), Arc::downgrade(&written.0));
    drop(written);
    assert_eq!(weak.strong_count(), 0, "no task keeps the connection");
    // The reader's end breaks the line (its task was aborted).
    for _ in 0..1000 {
        if line.broken.load(Ordering::Acquire) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let closed = line.broken.load(Ordering::Acquire);
    // SAFETY: as above.
    unsafe { libc::kill(server.pid() as i32, libc::SIGCONT) };
    assert!(closed, "its reader ended within 10 s");
}

/// One huge command's buffer is not kept once written.
#[tokio::test]
async fn a_huge_commands_buffer_is_let_go() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    let value = vec![b'x'; 32 << 20];
    written
        .send(redis::cmd("SET").arg("big").arg(&value))
        .await
        .expect("set");
    for _ in 0..10 {
        written.send(&redis::cmd("PING")).await.expect("pong");
    }
    let capacity = written.0.line.lock().outbox.capacity();
    assert!(capacity <= KEPT_OUTBOX, "the outbox keeps {capacity} bytes");
}

#[tokio::test]
async fn an_empty_command_is_refused_and_the_next_call_gets_its_own_reply() {
    let server = RedisServer::start();
    let (written, mut multiplexed) = both(&server.url()).await;
    written
        .send(redis::cmd("SET").arg("first").arg("1"))
        .await
        .expect("set");
    let empty = redis::pipe();
    let theirs = multiplexed.send_packed_commands(&empty, 0, 0).await;
    let ours = tokio::time::timeout(Duration::from_secs(10), written.send_pipeline(&empty, 0, 0))
        .await
        .expect("an answer within 10 s");
    assert_eq!(
        ours.expect_err("refused").kind(),
        theirs.expect_err("refused").kind()
    );
    let ours = tokio::time::timeout(Duration::from_secs(10), written.send(&Cmd::new()))
        .await
        .expect("an answer within 10 s");
    assert_eq!(ours.expect_err("refused").kind(), ErrorKind::Client);
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        written.send(redis::cmd("GET").arg("first")),
    )
    .await
    .expect("an answer within 10 s")
    .expect("an answer");
    assert_eq!(first, Value::BulkString(b"1".to_vec()), "its own reply");
}

#[tokio::test]
async fn a_refused_transaction_fails_as_the_crates_does() {
    let (ours, theirs) = (RedisServer::start(), RedisServer::start());
    let (written, _) = both(&ours.url()).await;
    let (_, mut multiplexed) = both(&theirs.url()).await;
    let mut transaction = redis::pipe();
    transaction
        .atomic()
        .cmd("INCR")
        .arg("t")
        .cmd("NOSUCHCOMMAND");
    let ours = written.send_pipeline(&transaction, 3, 1).await;
    let theirs = multiplexed.send_packed_commands(&transaction, 3, 1).await;
    assert_eq!(
        ours.expect_err("aborted").kind(),
        theirs.expect_err("aborted").kind()
    );
}

/// A server on loopback that answers each command (its arguments) with
/// the bytes `answer` gives, given whether the connection logged in.
async fn fake_server(answer: fn(&mut bool, &[Vec<u8>]) -> Vec<u8>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bound");
    let port = listener.local_addr().expect("an address").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut buffer, mut logged_in) = (Vec::new(), false);
                loop {
                    while let Ok(Some(length)) = frames::reply_length(&buffer) {
                        let args: Vec<Vec<u8>> = redis::from_redis_value(
                            redis::parse_redis_value(&buffer[..length]).expect("RESP"),
                        )
                        .expect("a command");
                        buffer.drain(..length);
                        let reply = answer(&mut logged_in, &args);
                        if stream.write_all(&reply).await.is_err() {
                            return;
                        }
                    }
                    match stream.read_buf(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn a_reply_that_is_not_resp_breaks_the_connection_at_once() {
    let port = fake_server(|_, _| b"\r\n".to_vec()).await;
    let written = CallerWritten::open(
        &client(&format!("redis://127.0.0.1:{port}")),
        Some(Duration::from_secs(10)),
    )
    .await;
    // The library's name is asked at login: its reply is not RESP.
    let failed = written.err().expect("the login's replies are not RESP");
    assert!(failed.is_io_error(), "{failed}");
    assert!(failed.to_string().contains("not RESP"), "{failed}");
}

/// Redis 5: `AUTH` takes a password only, and every other command is
/// refused before it.
fn redis_5(logged_in: &mut bool, args: &[Vec<u8>]) -> Vec<u8> {
    let name = String::from_utf8_lossy(&args[0]).to_uppercase();
    match (name.as_str(), args.len(), *logged_in) {
        ("AUTH", 2, _) if args[1] == b"secret" => {
            *logged_in = true;
            b"+OK\r\n".to_vec()
        }
        ("AUTH", 2, _) => b"-ERR invalid password\r\n".to_vec(),
        ("AUTH", _, _) => b"-ERR wrong number of arguments for 'auth' command\r\n".to_vec(),
        (_, _, false) => b"-NOAUTH Authentication required.\r\n".to_vec(),
        ("SELECT", _, true) => b"+OK\r\n".to_vec(),
        ("PING", _, true) => b"+PONG\r\n".to_vec(),
        (_, _, true) => b"-ERR unknown command\r\n".to_vec(),
    }
}

#[tokio::test]
async fn a_server_older_than_acls_is_logged_in_with_the_password_alone() {
    let port = fake_server(redis_5).await;
    let url = format!("redis://locker:secret@127.0.0.1:{port}/3");
    let mut theirs = client(&url)
        .get_multiplexed_async_connection()
        .await
        .expect("the crate logs in");
    assert_eq!(
        theirs
            .send_packed_command(&redis::cmd("PING"))
            .await
            .unwrap(),
        Value::SimpleString("PONG".into())
    );
    let ours = CallerWritten::open(&client(&url), Some(Duration::from_secs(10)))
        .await
        .expect("logged in");
    assert_eq!(
        ours.send(&redis::cmd("PING")).await.unwrap(),
        Value::SimpleString("PONG".into())
    );
}

/// Many calls at once, some given up after their first poll: every call
/// that completes gets its own reply (each task counts on a key of its
/// own, and a call given up still ran once written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_at_once_each_get_their_own_reply() {
    let server = RedisServer::start();
    let (written, _) = both(&server.url()).await;
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let written = written.clone();
            tokio::spawn(async move {
                let key = format!("count:{task}");
                let mut expected = 0;
                for call in 0..400 {
                    let mut incr = redis::cmd("INCR");
                    incr.arg(&key);
                    expected += 1;
                    if call % 7 == 3 {
                        // Given up after one poll: its command is written
                        // (by itself or by the call writing then), and its
                        // reply may even have come within that poll.
                        if let Some(reply) = written.send(&incr).now_or_never() {
                            assert_eq!(reply.expect("an answer"), Value::Int(expected));
                        }
                        continue;
                    }
                    if call % 5 == 0 {
                        let mut pipeline = redis::pipe();
                        pipeline.cmd("INCR").arg(&key).cmd("GET").arg(&key);
                        let replies = written
                            .send_pipeline(&pipeline, 0, 2)
                            .await
                            .expect("answers");
                        assert_eq!(
                            replies,
                            vec![
                                Value::Int(expected),
                                Value::BulkString(expected.to_string().into_bytes())
                            ]
                        );
                        continue;
                    }
                    let reply = written.send(&incr).await.expect("an answer");
                    assert_eq!(reply, Value::Int(expected), "{key}, call {call}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("every reply its own");
    }
    assert!(!written.is_broken());
}
