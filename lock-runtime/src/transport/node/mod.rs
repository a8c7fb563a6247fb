//! One multiplexed connection to one Redis server: opened on first use,
//! and again on the next call after it broke.
//!
//! This is what the `redis` crate's `ConnectionManager` did for this crate,
//! with less shared work per command. The manager held an `ArcSwap` guard
//! across every command (with many commands in flight, `arc_swap` runs out
//! of per-thread slots and takes its slow path) and cloned a shared future
//! and then the connection out of it: atomics on cache lines every worker
//! thread shares, per command. Here a command reads the state through a
//! guard held only to clone the open connection, the one clone the
//! `redis` crate needs to send on it (docs/benchmarks.md, "The shared kinds
//! and the client's CPU").
//!
//! - Opening: the first call opens the connection (within the client's
//!   connect timeout); calls made meanwhile wait for the same opening. The
//!   opening runs as a task of its own, so a call that gives up (its
//!   deadline passed) does not stop it.
//! - A failed opening is not kept: the next call opens again. (Retries
//!   and their pauses are `Connection::call`'s.) So a refused login works
//!   from the next call once the server takes it; the price is that an
//!   opening that cannot succeed (a database number out of range) is tried
//!   again by every call, each failing at once without retries.
//! - A panic while opening fails that opening, not every later call.
//! - A command that fails because the connection broke (closed while idle,
//!   reset, a dropped proxy) closes it; the next call opens a new one. A
//!   connection that stalls without breaking is `Connection::call`'s to
//!   replace, after a call timed out.
//! - What the server offers beyond Redis 7's commands ([`Offers`]: a plain
//!   conditional delete) is asked once per connection, in the background
//!   once it opened (`COMMAND INFO`: the calls waiting for the connection
//!   do not wait for that answer too), and kept with it: a connection opened
//!   again (after a restart, a failover behind the address) asks again.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::{Transport, Wire};

/// An opening connection, awaited by every call that needs it.
type Opening = Shared<BoxFuture<'static, RedisResult<Wire>>>;

/// A plain command that deletes a key only if it holds a given value, when
/// the server has one: Valkey 9's `DELIFEQ key value`, Redis 8.4's `DELEX key
/// IFEQ value`. A release whose value is exactly its token needs no script
/// then (design §2, "A release without Lua").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ConditionalDelete {
    /// Neither: the release script.
    #[default]
    None,
    DelIfEq,
    DelExIfEq,
}

/// What the server of one connection offers, asked once when it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Offers {
    pub(crate) conditional_delete: ConditionalDelete,
}

/// Asks the server what it offers (`COMMAND INFO DELIFEQ DELEX`: an entry
/// per command, nil for one it does not know). Any failure (an older
/// server without `COMMAND`, an ACL that refuses it, no answer within
/// `timeout`) means nothing more than Redis 7's commands.
async fn ask_offers(wire: &mut Wire, timeout: Option<std::time::Duration>) -> Offers {
    let mut ask = redis::cmd("COMMAND");
    ask.arg("INFO").arg("DELIFEQ").arg("DELEX");
    let reply = tokio::time::timeout(
        timeout.unwrap_or(std::time::Duration::from_secs(1)),
        wire.send(&ask),
    )
    .await;
    let known =
        |value: Option<&Value>| matches!(value, Some(Value::Array(entry)) if !entry.is_empty());
    let conditional_delete = match reply {
        Ok(Ok(Value::Array(entries))) if known(entries.first()) => ConditionalDelete::DelIfEq,
        Ok(Ok(Value::Array(entries))) if known(entries.get(1)) => ConditionalDelete::DelExIfEq,
        _ => ConditionalDelete::None,
    };
    Offers { conditional_delete }
}

/// A handle to one server's connection; cheap to clone (every clone uses
/// the same connection).
#[derive(Clone)]
pub(crate) struct NodeLink(Arc<Node>);

struct Node {
    client: redis::Client,
    transport: Transport,
    /// Ask each new connection what its server offers ([`Offers`]).
    ask_offers: bool,
    /// Read by every call; changed (under `changing`) only when the
    /// connection opens or closes.
    state: ArcSwap<State>,
    changing: Mutex<()>,
}

/// The connection now, and the number of the opening it came from (a
/// failure on an older connection leaves a newer one alone).
struct State {
    number: u64,
    now: Now,
}

enum Now {
    /// Not opened yet, or closed: the next call opens it.
    Closed,
    Opening(Opening),
    Open(Wire, Offers),
}

impl NodeLink {
    /// A connection to `client`'s server, opened on first use through
    /// `transport`.
    pub(crate) fn new(client: redis::Client, transport: Transport) -> NodeLink {
        NodeLink::with(client, transport, false)
    }

    fn with(client: redis::Client, transport: Transport, ask_offers: bool) -> NodeLink {
        NodeLink(Arc::new(Node {
            client,
            transport,
            ask_offers,
            state: ArcSwap::from_pointee(State {
                number: 0,
                now: Now::Closed,
            }),
            changing: Mutex::new(()),
        }))
    }

    /// The same, asking each connection it opens what its server offers
    /// (see [`offers`](Self::offers)): the lock's own calls on one server
    /// or a quorum's node.
    pub(crate) fn asking_offers(client: redis::Client, transport: Transport) -> NodeLink {
        // Over the simulated network a harness answers the lock's own
        // commands only.
        let ask = !transport.is_simulated();
        NodeLink::with(client, transport, ask)
    }

    /// What the server of the open connection offers; `None` while no
    /// connection is open (a call opens one).
    pub(crate) fn offers(&self) -> Option<Offers> {
        match &self.0.state.load().now {
            Now::Open(_, offers) => Some(*offers),
            _ => None,
        }
    }

    /// The open connection and its number: opened, or waited for while it
    /// opens, if need be.
    async fn connection(&self) -> RedisResult<(Wire, u64)> {
        let (opening, number) = {
            let state = self.0.state.load();
            match &state.now {
                Now::Open(connection, _) => return Ok((connection.clone(), state.number)),
                Now::Opening(opening) => (opening.clone(), state.number),
                Now::Closed => {
                    drop(state);
                    self.open()
                }
            }
        };
        match opening.await {
            Ok(connection) => {
                let opened = self.change(number, |now| match now {
                    Now::Opening(_) => Some(Now::Open(connection.clone(), Offers::default())),
                    _ => None,
                });
                if opened && self.0.ask_offers {
                    self.ask_offers(connection.clone(), number);
                }
                Ok((connection, number))
            }
            Err(error) => {
                self.close(number);
                Err(error)
            }
        }
    }

    /// Starts opening the connection, unless another call did: the opening
    /// and its number.
    fn open(&self) -> (Opening, u64) {
        let _changing = self.lock();
        let state = self.0.state.load_full();
        let opening = match &state.now {
            Now::Opening(opening) => return (opening.clone(), state.number),
            Now::Open(connection, _) => {
                let connection = connection.clone();
                return (async move { Ok(connection) }.boxed().shared(), state.number);
            }
            Now::Closed => {
                let client = self.0.client.clone();
                let transport = self.0.transport.clone();
                async move {
                    let opening = transport.connect(&client);
                    // A shared future that panicked panics again for every
                    // caller: a panic while opening (the connect timeout's
                    // timer of a runtime that ended meanwhile) fails this
                    // opening only, and the next call opens again.
                    match AssertUnwindSafe(opening).catch_unwind().await {
                        Ok(opened) => opened,
                        Err(_panic) => Err(RedisError::from(std::io::Error::other(
                            "opening the connection panicked",
                        ))),
                    }
                }
                .boxed()
                .shared()
            }
        };
        let number = state.number + 1;
        self.0.state.store(Arc::new(State {
            number,
            now: Now::Opening(opening.clone()),
        }));
        // Runs to its end even if every call waiting for it gives up.
        tokio::spawn(opening.clone().map(drop));
        (opening, number)
    }

    /// Closes connection `number` (it broke, or could not be opened); a
    /// newer one is left alone.
    fn close(&self, number: u64) {
        self.change(number, |now| match now {
            Now::Closed => None,
            _ => Some(Now::Closed),
        });
    }

    /// Replaces the state of connection `number` by what `next` makes of
    /// it (`None`: left as it is); whether it changed.
    fn change(&self, number: u64, next: impl FnOnce(&Now) -> Option<Now>) -> bool {
        let _changing = self.lock();
        let state = self.0.state.load();
        if state.number != number {
            return false;
        }
        if let Some(now) = next(&state.now) {
            drop(state);
            self.0.state.store(Arc::new(State { number, now }));
            return true;
        }
        false
    }

    /// Asks the server of connection `number` what it offers, in the
    /// background, and keeps the answer with that connection.
    fn ask_offers(&self, mut wire: Wire, number: u64) {
        let link = self.clone();
        let timeout = self.0.transport.connect_timeout();
        tokio::spawn(async move {
            let offers = ask_offers(&mut wire, timeout).await;
            link.change(number, |now| match now {
                Now::Open(wire, _) => Some(Now::Open(wire.clone(), offers)),
                _ => None,
            });
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.0
            .changing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// After `error` on connection `number`: closed if it broke (any I/O
    /// error: the connection's task ends after one, even one the `redis`
    /// crate does not count as a dropped connection, such as a timed-out
    /// read).
    fn failed(&self, number: u64, error: &RedisError) {
        if error.is_io_error() || error.is_unrecoverable_error() || error.is_connection_dropped() {
            self.close(number);
        }
    }

    /// Sends `cmd` and reads its reply.
    pub(crate) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (mut connection, number) = self.connection().await?;
        let reply = connection.send(cmd).await;
        if let Err(error) = &reply {
            self.failed(number, error);
        }
        reply
    }

    /// Sends `count` commands of `pipeline` from `offset` in one write and
    /// reads their replies.
    pub(crate) async fn send_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (mut connection, number) = self.connection().await?;
        let replies = connection.send_pipeline(pipeline, offset, count).await;
        if let Err(error) = &replies {
            self.failed(number, error);
        }
        replies
    }
}

impl ConnectionLike for NodeLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.send_pipeline(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.0.client.get_connection_info().redis_settings().db()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU32, Ordering};

    use redis::AsyncConnectionConfig;

    use super::*;

    /// Panics on its first lookup; then names port 0 of loopback, where
    /// no connection can be made.
    struct PanicsFirst {
        lookups: Arc<AtomicU32>,
    }

    impl redis::io::AsyncDNSResolver for PanicsFirst {
        fn resolve<'a, 'b: 'a>(
            &'a self,
            _host: &'b str,
            _port: u16,
        ) -> RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
            Box::pin(async move {
                if self.lookups.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("the first lookup panics (test)");
                }
                let addresses: Box<dyn Iterator<Item = SocketAddr> + Send> =
                    Box::new(std::iter::once(SocketAddr::from(([127, 0, 0, 1], 0))));
                Ok(addresses)
            })
        }
    }

    #[tokio::test]
    async fn a_panic_while_opening_fails_that_call_only() {
        let lookups = Arc::new(AtomicU32::new(0));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(5)))
            .set_dns_resolver(PanicsFirst {
                lookups: Arc::clone(&lookups),
            });
        let client = redis::Client::open("redis://redis.test:6379/").unwrap();
        let link = NodeLink::new(client, Transport::tcp_with(config));
        let ping = redis::cmd("PING");
        let first = link.send(&ping).await.expect_err("the opening panicked");
        assert!(first.to_string().contains("panicked"), "{first}");
        // Opened again (a second lookup), failing as a connection to a
        // port where none can be made fails, not with the first panic.
        let second = link.send(&ping).await.expect_err("nothing listens there");
        assert!(second.is_io_error(), "{second}");
        assert_eq!(lookups.load(Ordering::SeqCst), 2);
    }
}
