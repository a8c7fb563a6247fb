//! The simulated network (feature `simulation`): what a harness implements
//! so that the client's real code (everything above the transport) runs
//! over simulated Redis servers in one thread, and the adapter that makes
//! its connections [`Wire`](super::Wire)s and pub/sub connections.
//!
//! The client asks the [`Network`] for a connection to a node's address
//! (`host:port`, as the URLs, the slot map or the sentinels name it) and
//! sends commands on it; the harness decides what becomes of them (a
//! delay, a drop, a reply, a stalled node). Everything else stays in the
//! client's code, as over TCP: the connect timeout (a connection the
//! network never opens fails after it), each call's deadline and retries,
//! reconnection, Sentinel's epochs, the Cluster's redirections.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::{Cmd, ErrorKind, Msg, Pipeline, PushInfo, PushKind, RedisError, RedisResult, Value};
use tokio::sync::mpsc::UnboundedSender;

/// A message the server pushes on a connection (pub/sub): `kind`
/// [`PushKind::Message`] or [`PushKind::SMessage`] with `data` `[channel,
/// payload]`; a confirmation ([`PushKind::Subscribe`], [`PushKind::SSubscribe`],
/// `data` `[channel, count]`); a [`PushKind::SUnsubscribe`] the server sends
/// by itself (`[channel, count]`: the slot moved, its primary became a
/// replica). Values are `redis::Value::BulkString` and `Int`, as RESP3 has
/// them.
pub type Push = PushInfo;

/// A simulated network of Redis nodes (servers, sentinels), set with
/// `Config::network`: every connection of the client is opened here
/// instead of over TCP.
pub trait Network: Send + Sync + 'static {
    /// A connection to the node at `address` (`host:port`), or the error
    /// TCP would give: refused (`std::io::ErrorKind::ConnectionRefused`
    /// into a `RedisError`). A connection that never opens is failed by the
    /// client's connect timeout, as over TCP.
    fn connect(&self, address: &str) -> BoxFuture<'static, RedisResult<Arc<dyn Conn>>>;
}

/// One connection of the client to a node. The client closes it by
/// dropping its last `Arc` (implement `Drop` to tell the node: its
/// subscriptions end, as when a socket closes).
pub trait Conn: Send + Sync {
    /// The commands (each a list of arguments, the name first) sent in one
    /// write, and their replies in order, one per command: an error reply as
    /// `redis::Value::ServerError` (as RESP3 has it: parse the server's
    /// `-ERR ...` line with `redis::parse_redis_value` and take the
    /// value), a subscribe-like command's reply as its confirmation (which
    /// is also pushed, [`Conn::next_push`], before this resolves). An `Err`
    /// when the connection broke (an I/O error such as
    /// `std::io::ErrorKind::ConnectionReset`, and every later call fails
    /// too): the client then opens another. A stalled node is a future that
    /// does not resolve.
    fn send(&self, commands: Vec<Vec<Vec<u8>>>) -> BoxFuture<'static, RedisResult<Vec<Value>>>;

    /// The next message the server pushes on this connection ([`Push`]),
    /// in the order the server sent them (with the confirmations of
    /// subscriptions among them); `None` once the connection is closed.
    fn next_push(&self) -> BoxFuture<'static, Option<Push>>;
}

/// A command connection over the simulated network.
#[derive(Clone)]
pub(crate) struct SimWire {
    conn: Arc<dyn Conn>,
    db: i64,
}

impl SimWire {
    pub(crate) fn new(conn: Arc<dyn Conn>, node: &redis::Client) -> SimWire {
        SimWire {
            conn,
            db: node.get_connection_info().redis_settings().db(),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.db
    }

    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let mut replies = self.conn.send(vec![arguments(cmd)]).await?;
        match (replies.pop(), replies.is_empty()) {
            (Some(reply), true) => Ok(reply),
            _ => Err(wrong_count(1)),
        }
    }

    /// As over TCP: every command of `pipeline` (in `MULTI`/`EXEC` if it is
    /// a transaction) in one write, and `count` replies after `offset`.
    pub(crate) async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let mut commands: Vec<Vec<Vec<u8>>> = Vec::with_capacity(pipeline.len() + 2);
        let transaction = pipeline.is_transaction();
        if transaction {
            commands.push(vec![b"MULTI".to_vec()]);
        }
        commands.extend(pipeline.cmd_iter().map(arguments));
        if transaction {
            commands.push(vec![b"EXEC".to_vec()]);
        }
        let sent = commands.len();
        let replies = self.conn.send(commands).await?;
        if replies.len() != sent || offset + count > sent {
            return Err(wrong_count(sent));
        }
        Ok(replies.into_iter().skip(offset).take(count).collect())
    }
}

/// A command's arguments, its name first.
fn arguments(cmd: &Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            // This crate gives its SCAN cursors as plain arguments.
            _ => b"0".to_vec(),
        })
        .collect()
}

fn wrong_count(sent: usize) -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "the simulated network answered a different number of replies than commands sent",
        format!("{sent} sent"),
    ))
}

/// Opens a connection to `node` on `network` and logs in as the `redis`
/// crate would (`AUTH` with the URL's credentials, `SELECT` its
/// database), within `connect_timeout`.
pub(crate) async fn connect(
    network: &dyn Network,
    node: &redis::Client,
    connect_timeout: Option<Duration>,
) -> RedisResult<Arc<dyn Conn>> {
    let info = node.get_connection_info();
    let address = info.addr().to_string();
    let settings = info.redis_settings();
    let mut hello: Vec<Vec<Vec<u8>>> = Vec::new();
    if let Some(password) = settings.password() {
        let mut auth = vec![b"AUTH".to_vec()];
        if let Some(user) = settings.username() {
            auth.push(user.as_bytes().to_vec());
        }
        auth.push(password.as_bytes().to_vec());
        hello.push(auth);
    }
    if settings.db() != 0 {
        hello.push(vec![
            b"SELECT".to_vec(),
            settings.db().to_string().into_bytes(),
        ]);
    }
    let opening = async {
        let conn = network.connect(&address).await?;
        if !hello.is_empty() {
            let logins = settings.password().is_some();
            let replies = conn.send(hello).await?;
            for (at, reply) in replies.into_iter().enumerate() {
                if let Value::ServerError(error) = reply {
                    if at == 0 && logins {
                        return Err(RedisError::from((
                            ErrorKind::AuthenticationFailed,
                            "Password authentication failed",
                        )));
                    }
                    return Err(RedisError::from((
                        ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                        "Redis server refused to switch database",
                        error.details().unwrap_or_default().to_owned(),
                    )));
                }
            }
        }
        Ok(conn)
    };
    match connect_timeout {
        Some(timeout) => match tokio::time::timeout(timeout, opening).await {
            Ok(opened) => opened,
            Err(_elapsed) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        },
        None => opening.await,
    }
}

/// Sends what `conn` pushes to `pushes` (as the `redis` crate does with a
/// RESP3 connection's push sender), then a `Disconnection` when it closes.
/// Holds the connection only weakly: dropping the last `Wire` closes it.
pub(crate) fn forward_pushes(conn: &Arc<dyn Conn>, pushes: UnboundedSender<PushInfo>) {
    let conn: Weak<dyn Conn> = Arc::downgrade(conn);
    tokio::spawn(async move {
        loop {
            let Some(next) = conn.upgrade().map(|conn| conn.next_push()) else {
                return;
            };
            match next.await {
                Some(push) => {
                    if pushes.send(push).is_err() {
                        return;
                    }
                }
                None => {
                    let _ = pushes.send(PushInfo {
                        kind: PushKind::Disconnection,
                        data: Vec::new(),
                    });
                    return;
                }
            }
        }
    });
}

/// `SUBSCRIBE channel` on a pub/sub connection.
pub(crate) async fn subscribe(conn: &dyn Conn, channel: &str) -> RedisResult<()> {
    let replies = conn
        .send(vec![vec![
            b"SUBSCRIBE".to_vec(),
            channel.as_bytes().to_vec(),
        ]])
        .await?;
    match replies.into_iter().next() {
        Some(Value::ServerError(error)) => Err(error.into()),
        Some(_) => Ok(()),
        None => Err(wrong_count(1)),
    }
}

/// The next message of a pub/sub connection (confirmations passed over);
/// `None` once it closed.
pub(crate) async fn next_message(conn: &dyn Conn) -> Option<Msg> {
    loop {
        if let Some(message) = Msg::from_push_info(conn.next_push().await?) {
            return Some(message);
        }
    }
}
