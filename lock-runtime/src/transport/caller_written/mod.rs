//! A command connection its callers write to themselves: the transport of
//! a quorum's nodes over plain TCP (docs/design.md §2, "The quorum's
//! connections").
//!
//! The `redis` crate's multiplexed connection hands every call to a driver
//! task, which writes it and wakes the caller back with the reply: two
//! task hand-offs per call. A quorum makes each of its calls on every node
//! at once, so those hand-offs are most of the client's work there
//! (docs/benchmarks.md, "Issue 40, fourth pass": 81 % of the client's CPU in
//! the kernel, loopback TCP and `futex`). Here the caller writes its
//! command on the socket from its own task, under a lock that keeps
//! commands whole and in order, and one reader task per connection cuts
//! the replies (`frames`), parses each with the `redis` crate's parser and
//! hands it to the oldest call waiting.
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
//! - A call given up (its deadline passed) while its command was half
//!   written breaks the connection: the server would read the rest as
//!   garbage. One given up after its write leaves it whole; its reply is
//!   read and dropped.
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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A caller-written connection; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) struct CallerWritten(Arc<Shared>);

struct Shared {
    /// Held by the call that writes (`LineState::writing`): never waited
    /// for.
    write: tokio::sync::Mutex<OwnedWriteHalf>,
    line: Arc<Line>,
    db: i64,
    reader: tokio::task::AbortHandle,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.reader.abort();
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
    /// Whether a call is writing the outbox now (it writes what the others
    /// add meanwhile too, until the outbox is empty).
    writing: bool,
    /// Why the connection broke (every later call fails with it).
    broken: Option<(io::ErrorKind, String)>,
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

    /// Hands `value` to the oldest call waiting; false if none waits (a
    /// reply nobody asked for: the line is out of step).
    fn deliver(&self, value: Value) -> bool {
        let done = {
            let mut state = self.lock();
            let Some(call) = state.waiting.front_mut() else {
                return false;
            };
            call.read.push(value);
            if call.read.len() < call.replies {
                return true;
            }
            state.waiting.pop_front()
        };
        if let Some(call) = done {
            let _ = call.answer.send(Ok(call.read));
        }
        true
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
        let reader = tokio::spawn(read_replies(read, Arc::clone(&line))).abort_handle();
        let settings = info.redis_settings();
        let connection = CallerWritten(Arc::new(Shared {
            write: tokio::sync::Mutex::new(write),
            line,
            db: settings.db(),
            reader,
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
        let mut replies = self
            .call(1, |outbox| cmd.write_packed_command(outbox))
            .await?;
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
        let packed = pipeline.get_packed_pipeline();
        let replies = self
            .call(sent, |outbox| outbox.extend_from_slice(&packed))
            .await?;
        if pipeline.is_transaction() {
            // A command the server refused to queue aborts the transaction
            // (`EXECABORT`): the call's error, of the crate's kind.
            if let Some(Value::ServerError(error)) = replies.last() {
                return Err(error.clone().into());
            }
        }
        Ok(replies.into_iter().skip(offset).take(count).collect())
    }

    /// Takes a place in line for `replies` replies, adds the commands
    /// (`pack` writes them) to the outbox, becomes the writer unless
    /// another call is writing already, and waits for the replies.
    async fn call(
        &self,
        replies: usize,
        pack: impl FnOnce(&mut Vec<u8>),
    ) -> RedisResult<Vec<Value>> {
        let (answer, reply) = oneshot::channel();
        let writer = {
            let mut state = self.0.line.lock();
            if let Some((kind, reason)) = &state.broken {
                return Err(broken(*kind, reason));
            }
            let before = state.outbox.len();
            pack(&mut state.outbox);
            // Nothing written would be answered by nothing, and the next
            // call's reply would be taken for this one's: refused, as the
            // crate refuses it.
            if state.outbox.len() == before || replies == 0 {
                state.outbox.truncate(before);
                return Err(empty_command());
            }
            // Calls still waiting for replies: others are likely being
            // made at the same time, and worth waiting for (`write_out`).
            let busy = !state.waiting.is_empty();
            state.waiting.push_back(Waiting {
                replies,
                read: Vec::with_capacity(replies),
                answer,
            });
            (!std::mem::replace(&mut state.writing, true)).then_some(busy)
        };
        if let Some(busy) = writer {
            self.write_out(busy).await?;
        }
        match reply.await {
            Ok(replies) => replies,
            // The reader ended without a word (its runtime shut down).
            Err(_closed) => Err(broken(io::ErrorKind::BrokenPipe, "its reader stopped")),
        }
    }

    /// The writer's turn: on a `busy` connection (calls waiting for
    /// replies), lets the calls made at the same time add their commands
    /// first (one yield to the runtime); then writes the outbox, again and
    /// again until it is empty. So calls made at once go out in few writes,
    /// as the `redis` crate's driver task batches them, and a call made
    /// alone is written at once by its own task, with no hand-off to
    /// another.
    async fn write_out(&self, busy: bool) -> RedisResult<()> {
        let mut turn = Turn {
            connection: self,
            wrote: false,
            finished: false,
        };
        if busy {
            tokio::task::yield_now().await;
        }
        // Only the writer locks it: at most the one before it, just
        // finishing, still holds it.
        let mut write = self.0.write.lock().await;
        let mut batch = Vec::new();
        loop {
            {
                let mut state = self.0.line.lock();
                if state.broken.is_some() || state.outbox.is_empty() {
                    state.writing = false;
                    if state.outbox.capacity() == 0 {
                        // Its buffer is used again.
                        state.outbox = batch;
                    }
                    turn.finished = true;
                    return Ok(());
                }
                std::mem::swap(&mut state.outbox, &mut batch);
            }
            turn.wrote = true;
            if let Err(error) = write.write_all(&batch).await {
                turn.finished = true;
                self.0.line.break_with(error.kind(), error.to_string());
                return Err(error.into());
            }
            batch.clear();
        }
    }
}

/// A writer's turn given up before it ended (its call's deadline passed,
/// its caller dropped it). Given up before it wrote anything, the turn
/// passes to a task of its own, which writes the outbox (the other calls'
/// commands are in it). Given up in the middle of a write, the connection
/// breaks: the server may have read part of a command.
struct Turn<'a> {
    connection: &'a CallerWritten,
    wrote: bool,
    finished: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let line = &self.connection.0.line;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if !self.wrote => {
                let connection = self.connection.clone();
                runtime.spawn(async move {
                    let _ = connection.write_out(false).await;
                });
            }
            _ => line.break_with(
                io::ErrorKind::BrokenPipe,
                "a call was given up in the middle of writing commands",
            ),
        }
    }
}

/// Breaks the connection when its reader ends, however it ends (a panic,
/// its runtime shutting down): no call waits for replies nobody reads.
struct Reading(Arc<Line>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0
            .break_with(io::ErrorKind::BrokenPipe, "its reader stopped");
    }
}

/// The connection's reader: cuts what the server sends into replies and
/// hands each to the oldest call waiting, until the connection breaks.
async fn read_replies(mut read: OwnedReadHalf, line: Arc<Line>) {
    let _reading = Reading(Arc::clone(&line));
    let mut buffer: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let mut start = 0;
        loop {
            match frames::reply_length(&buffer[start..]) {
                Ok(Some(length)) => {
                    let value = redis::parse_redis_value(&buffer[start..start + length]);
                    start += length;
                    let delivered = match value {
                        Ok(value) => line.deliver(value),
                        Err(_) => false,
                    };
                    if !delivered {
                        line.break_with(
                            io::ErrorKind::InvalidData,
                            "the server sent a reply no call was waiting for",
                        );
                        return;
                    }
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
        buffer.drain(..start);
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(4096);
        }
        match read.read_buf(&mut buffer).await {
            Ok(0) => {
                line.break_with(io::ErrorKind::BrokenPipe, "the server closed it");
                return;
            }
            Ok(_) => {}
            Err(error) => {
                line.break_with(error.kind(), error.to_string());
                return;
            }
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
