//! Pub/sub: the channels and shard channels each connection of a node
//! listens on, and the messages a publish produces.

use std::collections::{BTreeMap, BTreeSet};

use redis::{PushKind, Value};

use crate::reply::Reply;

/// A connection of a [`Node`](crate::Node) or a
/// [`SentinelNode`](crate::SentinelNode), numbered from 1 in the order
/// they connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// Whether a message was published on a plain channel (`PUBLISH`) or a
/// shard channel (`SPUBLISH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageKind {
    /// `message`: from `PUBLISH`, to `SUBSCRIBE`rs.
    Message,
    /// `smessage`: from `SPUBLISH`, to `SSUBSCRIBE`rs.
    SMessage,
}

/// A published message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: MessageKind,
    pub channel: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Message {
    /// The message as a connection reads it: a push on a RESP3
    /// connection, an array `[message, channel, payload]` on a RESP2 one.
    pub fn to_value(&self, resp3: bool) -> Value {
        let kind = match self.kind {
            MessageKind::Message => PushKind::Message,
            MessageKind::SMessage => PushKind::SMessage,
        };
        Reply::Push(
            kind,
            vec![
                Reply::Bulk(self.channel.clone()),
                Reply::Bulk(self.payload.clone()),
            ],
        )
        .into_value(resp3)
    }
}

/// A message for one connection, shaped for its protocol.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub conn: ConnId,
    pub message: Message,
    /// What the connection reads (see [`Message::to_value`]).
    pub value: Value,
}

/// A publish that, in a cluster, other nodes deliver too: a `PUBLISH`
/// goes to every node of the cluster, an `SPUBLISH` to the nodes of the
/// shard that serves its slot (Redis sends both over the cluster bus; the
/// harness relays them, with [`Node::deliver`](crate::Node::deliver), when
/// and where it chooses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    pub message: Message,
    /// The slot of a shard channel (`SPUBLISH`).
    pub slot: Option<u16>,
}

/// Who listens on what.
#[derive(Clone, Debug, Default)]
pub(crate) struct PubSub {
    channels: BTreeMap<Vec<u8>, BTreeSet<ConnId>>,
    shard_channels: BTreeMap<Vec<u8>, BTreeSet<ConnId>>,
}

impl PubSub {
    fn map(&mut self, kind: MessageKind) -> &mut BTreeMap<Vec<u8>, BTreeSet<ConnId>> {
        match kind {
            MessageKind::Message => &mut self.channels,
            MessageKind::SMessage => &mut self.shard_channels,
        }
    }

    /// Adds a subscription; whether it is new.
    pub(crate) fn subscribe(&mut self, kind: MessageKind, conn: ConnId, channel: &[u8]) -> bool {
        self.map(kind)
            .entry(channel.to_vec())
            .or_default()
            .insert(conn)
    }

    /// Removes a subscription; whether it was there.
    pub(crate) fn unsubscribe(&mut self, kind: MessageKind, conn: ConnId, channel: &[u8]) -> bool {
        let map = self.map(kind);
        let Some(conns) = map.get_mut(channel) else {
            return false;
        };
        let removed = conns.remove(&conn);
        if conns.is_empty() {
            map.remove(channel);
        }
        removed
    }

    /// The connections that receive a message on `channel`, in order.
    pub(crate) fn receivers(&self, kind: MessageKind, channel: &[u8]) -> Vec<ConnId> {
        let map = match kind {
            MessageKind::Message => &self.channels,
            MessageKind::SMessage => &self.shard_channels,
        };
        map.get(channel)
            .map(|conns| conns.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The shard channels listened on whose slot is `slot` (`slot_of`
    /// computes a channel's slot).
    pub(crate) fn shard_channels_where(
        &self,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> Vec<(Vec<u8>, Vec<ConnId>)> {
        self.shard_channels
            .iter()
            .filter(|(channel, _)| keep(channel))
            .map(|(channel, conns)| (channel.clone(), conns.iter().copied().collect()))
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.channels.clear();
        self.shard_channels.clear();
    }
}
