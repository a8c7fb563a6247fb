//! The connections a [`Transport`](super::Transport) opens: a command
//! connection ([`Wire`]) and a pub/sub connection ([`PubSub`], then its
//! [`Messages`]), each over TCP or the simulated network.
//!
//! Over TCP a call goes straight to the `redis` crate's connection: an
//! enum, not a trait object, so the hot path gains neither an allocation
//! nor a dynamic call (without the `simulation` feature the enum has one
//! variant).

use std::future::Future;

#[cfg(feature = "simulation")]
use futures_util::future::Either;
use futures_util::stream::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Msg, Pipeline, RedisFuture, RedisResult, Value};

/// A multiplexed command connection; cheap to clone (clones share it).
#[derive(Clone)]
pub(crate) enum Wire {
    Tcp(MultiplexedConnection),
    #[cfg(feature = "simulation")]
    Simulated(super::simulated::SimWire),
}

impl Wire {
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(
        conn: std::sync::Arc<dyn super::simulated::Conn>,
        node: &redis::Client,
    ) -> Wire {
        Wire::Simulated(super::simulated::SimWire::new(conn, node))
    }

    /// Sends `cmd` and reads its reply (an error reply as
    /// `Value::ServerError`, as the `redis` crate gives it). Over TCP this
    /// is the `redis` crate's own future, not wrapped in another: no state
    /// machine of its own on the hot path.
    #[cfg(not(feature = "simulation"))]
    #[inline(always)]
    pub(crate) fn send<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        let Wire::Tcp(connection) = self;
        connection.send_packed_command(cmd)
    }

    /// Sends `cmd` and reads its reply (an error reply as
    /// `Value::ServerError`, as the `redis` crate gives it).
    #[cfg(feature = "simulation")]
    #[inline(always)]
    pub(crate) fn send<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'a {
        match self {
            Wire::Tcp(connection) => Either::Left(connection.send_packed_command(cmd)),
            Wire::Simulated(wire) => Either::Right(wire.send(cmd)),
        }
    }

    /// Sends `pipeline` in one write and reads `count` replies after the
    /// first `offset`.
    #[cfg(not(feature = "simulation"))]
    #[inline(always)]
    pub(crate) fn send_pipeline<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
        let Wire::Tcp(connection) = self;
        connection.send_packed_commands(pipeline, offset, count)
    }

    /// Sends `pipeline` in one write and reads `count` replies after the
    /// first `offset`.
    #[cfg(feature = "simulation")]
    #[inline(always)]
    pub(crate) fn send_pipeline<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'a {
        match self {
            Wire::Tcp(connection) => {
                Either::Left(connection.send_packed_commands(pipeline, offset, count))
            }
            Wire::Simulated(wire) => Either::Right(wire.send_pipeline(pipeline, offset, count)),
        }
    }
}

/// Boxed calls (Sentinel's, off the hot path). Over TCP, the `redis`
/// crate's own boxed calls, as before the seam: the hot path (`NodeLink`)
/// is then the only place in this crate that awaits the crate's send
/// futures directly, and the compiler inlines them there.
impl ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Wire::Tcp(connection) => connection.req_packed_command(cmd),
            #[cfg(feature = "simulation")]
            Wire::Simulated(wire) => Box::pin(wire.send(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Wire::Tcp(connection) => connection.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "simulation")]
            Wire::Simulated(wire) => Box::pin(wire.send_pipeline(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Wire::Tcp(connection) => connection.get_db(),
            #[cfg(feature = "simulation")]
            Wire::Simulated(wire) => wire.db(),
        }
    }
}

/// A pub/sub connection, before it is read.
pub(crate) enum PubSub {
    Tcp(redis::aio::PubSub),
    #[cfg(feature = "simulation")]
    Simulated(std::sync::Arc<dyn super::simulated::Conn>),
}

impl PubSub {
    /// Subscribes to `channel` (`SUBSCRIBE`), confirmed by the server.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            PubSub::Tcp(pubsub) => pubsub.subscribe(channel).await,
            #[cfg(feature = "simulation")]
            PubSub::Simulated(conn) => super::simulated::subscribe(conn.as_ref(), channel).await,
        }
    }

    /// The messages published on its channels, until it closes.
    pub(crate) fn into_messages(self) -> Messages {
        match self {
            PubSub::Tcp(pubsub) => Messages::Tcp(pubsub.into_on_message()),
            #[cfg(feature = "simulation")]
            PubSub::Simulated(conn) => Messages::Simulated(conn),
        }
    }
}

/// The messages of a pub/sub connection.
pub(crate) enum Messages {
    Tcp(redis::aio::PubSubStream),
    #[cfg(feature = "simulation")]
    Simulated(std::sync::Arc<dyn super::simulated::Conn>),
}

impl Messages {
    /// The next message; `None` once the connection closed.
    pub(crate) async fn next(&mut self) -> Option<Msg> {
        match self {
            Messages::Tcp(stream) => stream.next().await,
            #[cfg(feature = "simulation")]
            Messages::Simulated(conn) => super::simulated::next_message(conn.as_ref()).await,
        }
    }
}
