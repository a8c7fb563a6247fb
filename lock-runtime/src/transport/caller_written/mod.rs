//! A command connection its callers write to themselves: the transport of
//! a quorum's nodes over plain TCP (docs/design.md §10, "The quorum's
//! connections").
//!
//! The `redis` crate's multiplexed connection hands every call to a driver
//! task, which writes it and wakes the caller back with the reply: two
//! task hand-offs per call. A quorum makes each of its calls on every node
//! at once, so those hand-offs are most of the client's work there
//! (docs/benchmarks.md, "Issue 40, fourth pass": 81 % of the client's CPU in
//! the kernel, loopback TCP and `futex`). Here a call on an idle
//! connection writes its command itself, by one non-blocking write; on a
//! busy one it adds it to an outbox that the connection's task writes, batched
//! with the calls made at the same moment (`CallerWritten::call`). One
//! reader task per connection cuts the replies (`frames`), parses each
//! with the `redis` crate's parser and hands it to the oldest call
//! waiting.
//!
//! What the crate's connection did and this one does too, so that nothing
//! above the seam changes:
//! - Opening: TCP (no delay), then `AUTH` with the URL's credentials
//!   (again without the user name for a server older than ACLs),
//!   `SELECT` of its database and `CLIENT SETINFO` (`lib-name=lock-runtime`
//!   in `CLIENT LIST`), all within the connect timeout; a refused login is
//!   the crate's `AuthenticationFailed` error.
//! - Replies are the crate's values (an error reply a `Value::ServerError`);
//!   a pipeline's are cut after its `offset` as the crate cuts them.
//! - A broken connection (closed by the server, reset, unreadable bytes)
//!   fails every call waiting with an I/O error, and every later call at
//!   once: `NodeLink` then opens another ([`CallerWritten::is_broken`] lets
//!   it do so before the next call, not after it).
//! - A call given up (its deadline passed, its future dropped) is written
//!   whole all the same, and its reply read and dropped: the connection
//!   stays in step. A call never awaits while it writes, so one not polled
//!   for a while holds no other call up.
//!
//! Only plain TCP with RESP2 and no pushes: TLS, a Unix socket or RESP3
//! keep the `redis` crate's connection (`Transport::connect`).

mod frames;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisResult, Value};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

/// A caller-written connection; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) struct CallerWritten(Arc<Shared>);

struct Shared {
    /// Written by one at a time (`LineState::writer`): a call on an idle
    /// connection, or the connection's task.
    write: Arc<OwnedWriteHalf>,
    line: Arc<Line>,
    /// Wakes the driver: it is the writer (`Writer::Driver`).
    flush: Arc<Notify>,
    db: i64,
    driver: tokio::task::AbortHandle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The calls waiting for their replies, oldest first, and whether the
/// connection broke.
struct Line {
    broken: AtomicBool,
    state: Mutex<LineState>,
}

#[derive(Default)]
struct LineState {
    waiting: VecDeque<Waiting>,
    /// The commands of the calls waiting that are still to be written, in
    /// the calls' order.
    outbox: Vec<u8>,
    /// Who writes now: a call on an idle connection (for the length of
    /// one non-blocking write), or the driver (until the outbox is
    /// empty). Others only add to the outbox meanwhile, so that bytes go
    /// out in the line's order.
    writer: Writer,
    /// Why the connection broke (every later call fails with it).
    broken: Option<(io::ErrorKind, String)>,
}

/// Who writes a connection's commands now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Writer {
    /// Nobody: the next call on an idle connection writes by itself.
    #[default]
    Nobody,
    /// A call, writing its own command outside the lock.
    Caller,
    /// The connection's task (`drive`), writing the outbox.
    Driver,
}

/// One call: how many replies it waits for, those read so far, and where
/// they go.
struct Waiting {
    replies: usize,
    read: Vec<Value>,
    answer: oneshot::Sender<RedisResult<Vec<Value>>>,
}

impl Line {
    fn lock(&self) -> MutexGuard<'_, LineState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Breaks the connection (the first reason is kept): every call
    /// waiting fails with it.
    fn break_with(&self, kind: io::ErrorKind, reason: impl Into<String>) {
        let (waiting, (kind, reason)) = {
            let mut state = self.lock();
            let why = state
                .broken
                .get_or_insert_with(|| (kind, reason.into()))
                .clone();
            self.broken.store(true, Ordering::Release);
            state.outbox = Vec::new();
            (std::mem::take(&mut state.waiting), why)
        };
        for call in waiting {
            let _ = call.answer.send(Err(broken(kind, &reason)));
        }
    }

    /// Hands `values` (replies in the order read) to the calls waiting,
    /// oldest first, under one lock; false if one was left with no call
    /// waiting for it (the line is out of step). `done` is a buffer for
    /// the calls answered (empty on return).
    fn deliver(&self, values: &mut Vec<Value>, done: &mut Vec<Waiting>) -> bool {
        let mut values = values.drain(..);
        let in_step = {
            let mut state = self.lock();
            loop {
                let Some(value) = values.next() else {
                    break true;
                };
                let Some(call) = state.waiting.front_mut() else {
                    break false;
                };
                call.read.push(value);
                if call.read.len() == call.replies {
                    done.extend(state.waiting.pop_front());
                }
            }
        };
        for call in done.drain(..) {
            let _ = call.answer.send(Ok(call.read));
        }
        in_step
    }
}

/// The error of a call on a broken connection.
fn broken(kind: io::ErrorKind, reason: &str) -> RedisError {
    io::Error::new(kind, format!("the connection broke: {reason}")).into()
}

impl CallerWritten {
    /// Whether `node` can have one: plain TCP and RESP2 (TLS, a Unix
    /// socket, RESP3 keep the `redis` crate's connection).
    pub(crate) fn suits(node: &redis::Client) -> bool {
        let info = node.get_connection_info();
        matches!(info.addr(), ConnectionAddr::Tcp(..))
            && !info.redis_settings().protocol().supports_resp3()
    }

    /// Opens a connection to `node` and logs in (`AUTH`, `SELECT`), within
    /// `timeout` if one is given.
    pub(crate) async fn open(
        node: &redis::Client,
        timeout: Option<Duration>,
    ) -> RedisResult<CallerWritten> {
        let opening = Self::open_now(node);
        match timeout {
            Some(timeout) => {
                tokio::time::timeout(timeout, opening)
                    .await
                    .unwrap_or_else(|_elapsed| {
                        Err(io::Error::new(io::ErrorKind::TimedOut, "connection timed out").into())
                    })
            }
            None => opening.await,
        }
    }

    async fn open_now(node: &redis::Client) -> RedisResult<CallerWritten> {
        let info = node.get_connection_info();
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a caller-written connection is plain TCP only",
            )));
        };
        let stream = TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let line = Arc::new(Line {
            broken: AtomicBool::new(false),
            state: Mutex::new(LineState::default()),
        });
        let (write, flush) = (Arc::new(write), Arc::new(Notify::new()));
        let driver = tokio::spawn(drive(
            read,
            Arc::clone(&write),
            Arc::clone(&line),
            Arc::clone(&flush),
        ))
        .abort_handle();
        let settings = info.redis_settings();
        let connection = CallerWritten(Arc::new(Shared {
            write,
            line,
            flush,
            db: settings.db(),
            driver,
        }));
        connection
            .log_in(settings.username(), settings.password(), settings.db())
            .await?;
        Ok(connection)
    }

    /// `AUTH` (if the URL has a password), `SELECT` (if its database is
    /// not 0) and the library's name, in one write, checked as the `redis`
    /// crate checks them.
    async fn log_in(&self, user: Option<&str>, password: Option<&str>, db: i64) -> RedisResult<()> {
        let mut setup = redis::pipe();
        if let Some(password) = password {
            let auth = setup.cmd("AUTH");
            if let Some(user) = user {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if db != 0 {
            setup.cmd("SELECT").arg(db);
        }
        // Names the library in `CLIENT LIST` (Redis 7.2 and later; an older
        // server's error reply is ignored, as the crate ignores it).
        setup
            .cmd("CLIENT")
            .arg("SETINFO")
            .arg("LIB-NAME")
            .arg("lock-runtime");
        setup
            .cmd("CLIENT")
            .arg("SETINFO")
            .arg("LIB-VER")
            .arg(env!("CARGO_PKG_VERSION"));
        let replies = self.send_pipeline(&setup, 0, setup.len()).await?;
        let mut replies = replies.into_iter();
        if password.is_some() {
            match replies.next() {
                Some(Value::Okay) => {}
                // A server older than ACLs (Redis 5) takes a password only:
                // the whole login again without the user name (its `SELECT`
                // was refused too, before any `AUTH` succeeded).
                Some(Value::ServerError(error))
                    if user.is_some()
                        && error.details().is_some_and(|details| {
                            details.contains("wrong number of arguments for 'auth' command")
                        }) =>
                {
                    return Box::pin(self.log_in(None, password, db)).await;
                }
                _ => return Err(refused_login()),
            }
        }
        if db != 0 {
            if let Some(Value::ServerError(error)) = replies.next() {
                let refused = "Redis server refused to switch database";
                return Err(match error.details() {
                    Some(details) => RedisError::from((
                        redis::ServerErrorKind::ResponseError.into(),
                        refused,
                        details.to_owned(),
                    )),
                    None => {
                        RedisError::from((redis::ServerErrorKind::ResponseError.into(), refused))
                    }
                });
            }
        }
        Ok(())
    }

    /// The database its calls use.
    pub(crate) fn db(&self) -> i64 {
        self.0.db
    }

    /// Whether it broke: every call on it would fail.
    pub(crate) fn is_broken(&self) -> bool {
        self.0.line.broken.load(Ordering::Acquire)
    }

    /// Sends `cmd` and reads its reply.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        // A command of no arguments packs to `*0`, which the server
        // answers with nothing (see `call`).
        if cmd.args_iter().next().is_none() {
            return Err(empty_command());
        }
        let mut replies = self.call(&cmd.get_packed_command(), 1).await?;
        Ok(replies.pop().unwrap_or(Value::Nil))
    }

    /// Sends `pipeline` (in `MULTI`/`EXEC` if it is a transaction) in one
    /// write, and returns `count` replies after the first `offset`, as the
    /// `redis` crate does (a transaction's `EXEC` reply after `offset =
    /// len + 1`).
    pub(crate) async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if pipeline
            .cmd_iter()
            .any(|cmd| cmd.args_iter().next().is_none())
        {
            return Err(empty_command());
        }
        let sent = pipeline.len() + if pipeline.is_transaction() { 2 } else { 0 };
        let replies = self.call(&pipeline.get_packed_pipeline(), sent).await?;
        if pipeline.is_transaction() {
            // A command the server refused to queue aborts the transaction
            // (`EXECABORT`): the call's error, of the crate's kind.
            if let Some(Value::ServerError(error)) = replies.last() {
                return Err(error.clone().into());
            }
        }
        Ok(replies.into_iter().skip(offset).take(count).collect())
    }

    /// Takes a place in line for `replies` replies of `command`, has it
    /// written, and waits for the replies.
    ///
    /// - On an idle connection (no call waiting for replies, nobody
    ///   writing), the call writes its command itself, at once, by one
    ///   non-blocking write: no task is woken to write it. What the socket
    ///   does not take goes to the outbox, for the connection's task.
    /// - On a busy connection, it adds its command to the outbox and, if
    ///   nobody is writing, wakes the connection's task: by the time it runs,
    ///   the calls made at the same moment have added theirs, and one
    ///   write takes them all, as the `redis` crate's driver task batches
    ///   them.
    ///
    /// A call never awaits while it is the writer, so one given up (its
    /// deadline passed, its future dropped) or not polled for a while
    /// holds nobody else up, and its command is written whole either way
    /// (the crate's connection, too, writes a call given up).
    async fn call(&self, command: &[u8], replies: usize) -> RedisResult<Vec<Value>> {
        // Nothing written would be answered by nothing, and the next call's
        // reply would be taken for this one's: refused, as the crate
        // refuses it.
        if command.is_empty() || replies == 0 {
            return Err(empty_command());
        }
        let (answer, reply) = oneshot::channel();
        let idle = {
            let mut state = self.0.line.lock();
            if let Some((kind, reason)) = &state.broken {
                return Err(broken(*kind, reason));
            }
            let idle = state.waiting.is_empty() && state.writer == Writer::Nobody;
            state.waiting.push_back(Waiting {
                replies,
                read: Vec::with_capacity(replies),
                answer,
            });
            if idle {
                state.writer = Writer::Caller;
            } else {
                state.outbox.extend_from_slice(command);
            }
            // The driver is woken when it becomes the writer.
            let wake = !idle && state.writer == Writer::Nobody;
            if wake {
                state.writer = Writer::Driver;
            }
            (idle, wake)
        };
        let wake_driver = match idle {
            (true, _) => {
                // The writer, outside the lock: calls made meanwhile add
                // to the outbox behind it.
                let written = match self.0.write.try_write(command) {
                    Ok(written) => written,
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => 0,
                    Err(error) => {
                        self.0.line.break_with(error.kind(), error.to_string());
                        return Err(error.into());
                    }
                };
                let mut state = self.0.line.lock();
                if written < command.len() {
                    // The rest, ahead of what others added meanwhile.
                    state
                        .outbox
                        .splice(0..0, command[written..].iter().copied());
                }
                if state.outbox.is_empty() {
                    state.writer = Writer::Nobody;
                    false
                } else {
                    state.writer = Writer::Driver;
                    true
                }
            }
            (false, wake) => wake,
        };
        if wake_driver {
            self.0.flush.notify_one();
        }
        match reply.await {
            Ok(replies) => replies,
            // The reader ended without a word (its runtime shut down).
            Err(_closed) => Err(broken(io::ErrorKind::BrokenPipe, "its reader stopped")),
        }
    }
}

/// The largest outbox buffer kept for the next batch: a huge command's is
/// let go once written.
const KEPT_OUTBOX: usize = 64 * 1024;

/// Breaks the connection when its reader ends, however it ends (a panic,
/// its runtime shutting down): no call waits for replies nobody reads.
struct Reading(Arc<Line>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0
            .break_with(io::ErrorKind::BrokenPipe, "its reader stopped");
    }
}

/// The connection's task: cuts what the server sends into replies and
/// hands them to the calls waiting, oldest first; and writes the outbox
/// whenever it holds something (a busy connection's calls), batched with
/// what calls add meanwhile. One task for both, as the `redis` crate's
/// driver: replies arriving wake it, and it writes what was added since
/// in the same turn. Ends when the connection breaks, or with it
/// (aborted).
async fn drive(
    mut read: OwnedReadHalf,
    write: Arc<OwnedWriteHalf>,
    line: Arc<Line>,
    flush: Arc<Notify>,
) {
    let _reading = Reading(Arc::clone(&line));
    let mut buffer: Vec<u8> = Vec::with_capacity(4096);
    let (mut values, mut done) = (Vec::new(), Vec::new());
    // The batch being written, and how much of it is written.
    let (mut batch, mut at) = (Vec::<u8>::new(), 0);
    loop {
        // Registered before the outbox is looked at: a call that adds to
        // it after that wakes this turn's wait.
        let notified = flush.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Write what there is, until the socket takes no more.
        loop {
            if at == batch.len() {
                batch.clear();
                if batch.capacity() > KEPT_OUTBOX {
                    batch = Vec::new();
                }
                at = 0;
                let mut state = line.lock();
                if state.broken.is_some() {
                    return;
                }
                // Only the writer writes: a call writing its own command
                // now is ahead of what the outbox holds.
                if state.writer != Writer::Driver {
                    break;
                }
                if state.outbox.is_empty() {
                    state.writer = Writer::Nobody;
                    break;
                }
                std::mem::swap(&mut state.outbox, &mut batch);
            }
            match write.try_write(&batch[at..]) {
                Ok(written) => at += written,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => {
                    line.break_with(error.kind(), error.to_string());
                    return;
                }
            }
        }
        let writing = at < batch.len();
        tokio::select! {
            biased;
            read = read.read_buf(&mut buffer) => match read {
                Ok(0) => {
                    line.break_with(io::ErrorKind::BrokenPipe, "the server closed it");
                    return;
                }
                Ok(_) => {}
                Err(error) => {
                    line.break_with(error.kind(), error.to_string());
                    return;
                }
            },
            _ = &mut notified => {}
            ready = write.writable(), if writing => {
                if let Err(error) = ready {
                    line.break_with(error.kind(), error.to_string());
                    return;
                }
            }
        }
        // Every whole reply read, handed over together.
        let mut start = 0;
        loop {
            match frames::reply_length(&buffer[start..]) {
                Ok(Some(length)) => {
                    match redis::parse_redis_value(&buffer[start..start + length]) {
                        Ok(value) => values.push(value),
                        Err(_) => {
                            line.break_with(
                                io::ErrorKind::InvalidData,
                                "the server sent a reply the parser refused",
                            );
                            return;
                        }
                    }
                    start += length;
                }
                Ok(None) => break,
                Err(frames::NotResp) => {
                    line.break_with(
                        io::ErrorKind::InvalidData,
                        "the server sent bytes that are not RESP",
                    );
                    return;
                }
            }
        }
        if !values.is_empty() && !line.deliver(&mut values, &mut done) {
            line.break_with(
                io::ErrorKind::InvalidData,
                "the server sent a reply no call was waiting for",
            );
            return;
        }
        buffer.drain(..start);
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(4096);
        }
    }
}

/// The crate's error for a command of no arguments.
fn empty_command() -> RedisError {
    RedisError::from((ErrorKind::Client, "empty command"))
}

/// The crate's error for a refused `AUTH`.
fn refused_login() -> RedisError {
    RedisError::from((
        ErrorKind::AuthenticationFailed,
        "Password authentication failed",
    ))
}
