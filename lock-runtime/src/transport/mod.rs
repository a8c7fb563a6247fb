//! How the client reaches Redis: the seam between the backend's protocol
//! (scripts, calls, retries, deadlines) and the network.
//!
//! Every connection the client opens goes through a [`Transport`]: "open a
//! command connection to this node" ([`Transport::connect`], a [`Wire`])
//! and "open a pub/sub connection to this node" ([`Transport::pubsub`]).
//! Over TCP they are the `redis` crate's connections, as they always were;
//! with the `simulation` feature and `Config::network`, the simulated
//! network's (`simulated`). Above the seam, and unchanged whichever it is:
//! one node's connection (`node`), a Redis Cluster's nodes by its slot map
//! (`cluster`), the primary Redis Sentinel names (`sentinel`), and in the
//! backend every deadline, retry and redirection.

pub(crate) mod cluster;
pub(crate) mod node;
pub(crate) mod sentinel;
#[cfg(feature = "simulation")]
pub(crate) mod simulated;
pub(crate) mod switches;
mod wire;

use std::future::Future;
use std::time::Duration;

use redis::{AsyncConnectionConfig, PushInfo, RedisResult};
use tokio::sync::mpsc::UnboundedSender;

pub(crate) use wire::{PubSub, Wire};

/// How the client's connections are opened: over TCP (the `redis`
/// crate's connections, with these settings) or over the simulated network.
/// Cheap to clone.
#[derive(Clone)]
pub(crate) struct Transport {
    /// The `redis` crate's settings of a command connection: the connect
    /// timeout, no response timeout (every call runs under
    /// `Connection::call`'s deadline), and where pushes go, if anywhere.
    config: AsyncConnectionConfig,
    /// The connect timeout, for the simulated network (TCP has it in
    /// `config`).
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))]
    connect_timeout: Option<Duration>,
    /// Where the pushes of command connections go (pub/sub on a RESP3
    /// connection), for the simulated network (TCP has it in `config`).
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))]
    pushes: Option<UnboundedSender<PushInfo>>,
    /// The simulated network, if the client uses one.
    #[cfg(feature = "simulation")]
    network: Option<std::sync::Arc<dyn simulated::Network>>,
}

impl Transport {
    /// TCP, each connection opened within `connect_timeout`.
    pub(crate) fn tcp(connect_timeout: Duration) -> Transport {
        Transport {
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(None),
            connect_timeout: Some(connect_timeout),
            pushes: None,
            #[cfg(feature = "simulation")]
            network: None,
        }
    }

    /// TCP with the `redis` crate's `config` as it is.
    #[cfg(test)]
    pub(crate) fn tcp_with(config: AsyncConnectionConfig) -> Transport {
        Transport {
            config,
            connect_timeout: None,
            pushes: None,
            #[cfg(feature = "simulation")]
            network: None,
        }
    }

    /// The same, over the simulated `network` instead of TCP.
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(
        mut self,
        network: std::sync::Arc<dyn simulated::Network>,
    ) -> Transport {
        self.network = Some(network);
        self
    }

    /// The same, with the pushes of every command connection (pub/sub
    /// messages and confirmations on RESP3, and a `Disconnection` when one
    /// closes) sent to `pushes`.
    pub(crate) fn with_pushes(&self, pushes: UnboundedSender<PushInfo>) -> Transport {
        let mut transport = self.clone();
        transport.config = transport.config.set_push_sender(pushes.clone());
        transport.pushes = Some(pushes);
        transport
    }

    /// Whether connections go over the simulated network (which answers
    /// the lock's own commands only).
    pub(crate) fn is_simulated(&self) -> bool {
        #[cfg(feature = "simulation")]
        if self.network.is_some() {
            return true;
        }
        false
    }

    /// The connect timeout, if any (TCP's is also in `config`).
    pub(crate) fn connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// A multiplexed command connection to `node` (its address, credentials,
    /// database and TLS), opened now.
    pub(crate) async fn connect(&self, node: &redis::Client) -> RedisResult<Wire> {
        #[cfg(feature = "simulation")]
        if let Some(network) = &self.network {
            let conn = simulated::connect(network.as_ref(), node, self.connect_timeout).await?;
            if let Some(pushes) = &self.pushes {
                simulated::forward_pushes(&conn, pushes.clone());
            }
            return Ok(Wire::simulated(conn, node));
        }
        node.get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map(Wire::Tcp)
    }

    /// A pub/sub connection to `node` (subscribe with [`PubSub::subscribe`],
    /// then read its messages).
    pub(crate) async fn pubsub(&self, node: &redis::Client) -> RedisResult<PubSub> {
        #[cfg(feature = "simulation")]
        if let Some(network) = &self.network {
            let conn = simulated::connect(network.as_ref(), node, self.connect_timeout).await?;
            return Ok(PubSub::Simulated(conn));
        }
        node.get_async_pubsub().await.map(PubSub::Tcp)
    }
}

/// The error of a call that got no answer within `deadline`.
pub(crate) fn timed_out(deadline: Duration) -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {}", crate::error::Readable(deadline)),
    )
    .into()
}

/// Runs one Redis call, failing with an I/O `TimedOut` error when it takes
/// longer than `deadline`.
pub(crate) async fn within<T>(
    deadline: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(deadline, call).await {
        Ok(result) => result,
        Err(_elapsed) => Err(timed_out(deadline)),
    }
}
