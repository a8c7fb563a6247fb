//! What a data command works on: the keyspace, the clock, and the effects
//! it leaves (writes to propagate, messages to deliver).

use crate::config::Flavour;
use crate::keyspace::{Clock, Db, Entry, ExpireMode};
use crate::pubsub::{ConnId, Message, MessageKind, PubSub, Publication};

/// A write to propagate to replicas, in the database it applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Effect {
    pub(crate) db: usize,
    pub(crate) argv: Vec<Vec<u8>>,
}

/// What commands leave behind, gathered over one call (a script's whole
/// run included).
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) effects: Vec<Effect>,
    pub(crate) published: Vec<(ConnId, Message)>,
    pub(crate) relay: Vec<Publication>,
}

/// One command's view of the server.
pub(crate) struct Ctx<'a> {
    pub(crate) dbs: &'a mut [Db],
    /// The database of the client that runs the command (a script's own
    /// client for `redis.call`).
    pub(crate) db: &'a mut usize,
    pub(crate) clock: Clock,
    pub(crate) pubsub: &'a PubSub,
    pub(crate) out: &'a mut Outbox,
    pub(crate) flavour: Flavour,
    /// Cluster mode: one database, publishes relayed over the cluster bus
    /// rather than the replication stream.
    pub(crate) cluster: bool,
    /// The client speaks RESP3 (a few replies have another shape).
    pub(crate) resp3: bool,
}

impl Ctx<'_> {
    pub(crate) fn db(&mut self) -> &mut Db {
        &mut self.dbs[*self.db]
    }

    /// Deletes `key` if its time has passed (propagating `DEL` on a
    /// primary); whether it did.
    fn expire_if_needed(&mut self, key: &[u8]) -> bool {
        let db = *self.db;
        let clock = self.clock;
        if clock.mode != ExpireMode::Delete {
            return false;
        }
        let Some(entry) = self.dbs[db].peek(key) else {
            return false;
        };
        if !clock.expired(entry.expire_ms) {
            return false;
        }
        self.dbs[db].remove(key);
        self.out.effects.push(Effect {
            db,
            argv: vec![b"DEL".to_vec(), key.to_vec()],
        });
        true
    }

    /// The live entry of `key`, if any.
    pub(crate) fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.expire_if_needed(key);
        let clock = self.clock;
        let entry = self.dbs[*self.db].peek_mut(key)?;
        if clock.expired(entry.expire_ms) {
            return None; // a replica hides it
        }
        Some(entry)
    }

    /// Deletes `key` if it is live; whether it was.
    pub(crate) fn delete(&mut self, key: &[u8]) -> bool {
        if self.entry(key).is_none() {
            return false;
        }
        self.db().remove(key).is_some()
    }

    pub(crate) fn insert(&mut self, key: &[u8], entry: Entry) {
        self.db().insert(key.to_vec(), entry);
    }

    /// Records a write for the replicas (and the `WAIT` offset).
    pub(crate) fn propagate(&mut self, argv: Vec<Vec<u8>>) {
        let db = *self.db;
        self.out.effects.push(Effect { db, argv });
    }

    /// Delivers a message to this node's listeners; returns how many.
    /// Outside a cluster the publish is also propagated to replicas (whose
    /// listeners receive it too); in a cluster it is to be relayed.
    pub(crate) fn publish(&mut self, kind: MessageKind, channel: &[u8], payload: &[u8]) -> i64 {
        let message = Message {
            kind,
            channel: channel.to_vec(),
            payload: payload.to_vec(),
        };
        let receivers = self.pubsub.receivers(kind, channel);
        for conn in &receivers {
            self.out.published.push((*conn, message.clone()));
        }
        if self.cluster {
            let slot = (kind == MessageKind::SMessage).then(|| crate::cluster::key_slot(channel));
            self.out.relay.push(Publication { message, slot });
        } else {
            let name: &[u8] = match kind {
                MessageKind::Message => b"PUBLISH",
                MessageKind::SMessage => b"SPUBLISH",
            };
            self.propagate(vec![name.to_vec(), channel.to_vec(), payload.to_vec()]);
        }
        receivers.len() as i64
    }
}
