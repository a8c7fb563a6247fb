//! Replication: a primary's stream of effects with byte offsets (its
//! backlog), the acknowledgements of its replicas (for `WAIT` and `ROLE`),
//! and a replica's place in its primary's stream. The harness carries the
//! entries from primary to replica itself, so that it can delay, drop or
//! cut replication; a failover then loses what was not carried.

use std::collections::{BTreeMap, VecDeque};

use crate::ctx::Effect;
use crate::keyspace::Db;

/// One atomic unit of a primary's replication stream: the effects of one
/// command or one script (wrapped in `MULTI`/`EXEC` when more than one),
/// all in one database. Offsets count the bytes of the RESP encoding, as
/// Redis's do (the `SELECT`s a database change needs included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplEntry {
    /// The primary's offset before this entry.
    pub start: u64,
    /// The primary's offset after it.
    pub end: u64,
    /// The database the commands apply to.
    pub db: usize,
    /// The commands, in order (without `MULTI`/`EXEC`/`SELECT`).
    pub commands: Vec<Vec<Vec<u8>>>,
}

/// A copy of a primary's dataset at an offset: what a full
/// resynchronisation gives a replica (the RDB file, in Redis).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub(crate) replid: String,
    pub(crate) offset: u64,
    pub(crate) dbs: Vec<Db>,
}

impl Snapshot {
    /// The replication id the replica continues with.
    pub fn replid(&self) -> &str {
        &self.replid
    }

    /// The offset the replica continues from.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// What a primary answers a replica's `PSYNC <replid> <offset>`.
#[derive(Clone, Debug)]
pub enum Sync {
    /// A partial resynchronisation: the entries after the replica's
    /// offset (maybe none), under the primary's current replication id.
    Continue {
        replid: String,
        entries: Vec<ReplEntry>,
    },
    /// A full resynchronisation: the whole dataset, then the stream from
    /// its offset.
    Full(Snapshot),
}

/// The state of a replica's link to its primary, as `ROLE` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Not connected (`connect`).
    Connect,
    /// Connecting (`connecting`).
    Connecting,
    /// Receiving a full resynchronisation (`sync`).
    Sync,
    /// Connected and in step (`connected`).
    Connected,
}

impl LinkState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            LinkState::Connect => "connect",
            LinkState::Connecting => "connecting",
            LinkState::Sync => "sync",
            LinkState::Connected => "connected",
        }
    }
}

/// A node's role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica {
        host: String,
        port: u16,
        link: LinkState,
    },
}

/// An entry handed to a replica that does not continue its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    /// The replica's offset (where the next entry must start).
    pub expected: u64,
    /// Where the entry started.
    pub got: u64,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a replication entry starting at offset {} handed to a replica at offset {} \
             (resynchronise it with psync)",
            self.got, self.expected
        )
    }
}

impl std::error::Error for Gap {}

/// The replication state of a node.
#[derive(Clone, Debug)]
pub(crate) struct Replication {
    pub(crate) role: Role,
    pub(crate) replid: String,
    /// The previous replication id, and the last offset that belongs to
    /// it (a promoted replica lets the other replicas of its old primary
    /// continue up to there).
    pub(crate) replid2: Option<(String, u64)>,
    /// The primary's offset; a replica's processed offset.
    pub(crate) offset: u64,
    backlog: VecDeque<ReplEntry>,
    backlog_max: usize,
    /// The database of the last entry (a change costs a `SELECT`).
    last_db: Option<usize>,
    /// Replicas by address, with the offset each acknowledged.
    pub(crate) replicas: BTreeMap<(String, u16), u64>,
    /// Makes replication ids: one per node history.
    seed: String,
    generation: u64,
}

/// The bytes of a command in RESP.
fn resp_len(argv: &[Vec<u8>]) -> u64 {
    let mut len = format!("*{}\r\n", argv.len()).len();
    for arg in argv {
        len += format!("${}\r\n", arg.len()).len() + arg.len() + 2;
    }
    len as u64
}

impl Replication {
    pub(crate) fn new(seed: String, backlog_max: usize) -> Replication {
        let mut replication = Replication {
            role: Role::Primary,
            replid: String::new(),
            replid2: None,
            offset: 0,
            backlog: VecDeque::new(),
            backlog_max,
            last_db: None,
            replicas: BTreeMap::new(),
            seed,
            generation: 0,
        };
        replication.replid = replication.new_replid();
        replication
    }

    /// A fresh 40-character id, the same for the same node history.
    fn new_replid(&mut self) -> String {
        self.generation += 1;
        crate::lua::sha1_hex(format!("{}#{}", self.seed, self.generation).as_bytes())
    }

    pub(crate) fn is_replica(&self) -> bool {
        matches!(self.role, Role::Replica { .. })
    }

    /// Appends the effects of one command or script to the stream (a
    /// primary); returns the new offset, or `None` when there were none.
    pub(crate) fn feed(&mut self, effects: Vec<Effect>) -> Option<u64> {
        if effects.is_empty() || self.is_replica() {
            return None;
        }
        // Effects of one call are in one database, except after a SELECT
        // inside a script: then one entry per run of a database.
        let mut runs: Vec<(usize, Vec<Vec<Vec<u8>>>)> = Vec::new();
        for effect in effects {
            match runs.last_mut() {
                Some((db, commands)) if *db == effect.db => commands.push(effect.argv),
                _ => runs.push((effect.db, vec![effect.argv])),
            }
        }
        let wrap = runs.iter().map(|(_, c)| c.len()).sum::<usize>() > 1;
        let count = runs.len();
        for (i, (db, commands)) in runs.into_iter().enumerate() {
            let mut len = 0;
            if self.last_db != Some(db) {
                len += resp_len(&[b"SELECT".to_vec(), db.to_string().into_bytes()]);
                self.last_db = Some(db);
            }
            if wrap && i == 0 {
                len += resp_len(&[b"MULTI".to_vec()]);
            }
            len += commands.iter().map(|c| resp_len(c)).sum::<u64>();
            if wrap && i + 1 == count {
                len += resp_len(&[b"EXEC".to_vec()]);
            }
            let entry = ReplEntry {
                start: self.offset,
                end: self.offset + len,
                db,
                commands,
            };
            self.offset = entry.end;
            self.backlog.push_back(entry);
        }
        while self.backlog.len() > self.backlog_max {
            self.backlog.pop_front();
        }
        Some(self.offset)
    }

    /// The entries after `offset`, if the backlog still has them all.
    pub(crate) fn entries_since(&self, offset: u64) -> Option<Vec<ReplEntry>> {
        if offset > self.offset {
            return None;
        }
        if offset == self.offset {
            return Some(Vec::new());
        }
        let first = self.backlog.front()?;
        if offset < first.start {
            return None;
        }
        let entries: Vec<ReplEntry> = self
            .backlog
            .iter()
            .filter(|entry| entry.end > offset)
            .cloned()
            .collect();
        // Offsets land on entry boundaries only.
        (entries.first().map(|e| e.start) == Some(offset)).then_some(entries)
    }

    /// Whether a replica at `replid`/`offset` may continue from here.
    pub(crate) fn can_continue(&self, replid: &str, offset: u64) -> bool {
        let known = replid == self.replid
            || self
                .replid2
                .as_ref()
                .is_some_and(|(old, last)| old == replid && offset <= *last);
        known && self.entries_since(offset).is_some()
    }

    /// A replica becomes a primary (`REPLICAOF NO ONE`, a failover): a
    /// new replication id, the old one kept for the other replicas.
    pub(crate) fn promote(&mut self) {
        if !self.is_replica() {
            return;
        }
        let old = std::mem::take(&mut self.replid);
        self.replid2 = Some((old, self.offset));
        self.replid = self.new_replid();
        self.role = Role::Primary;
        self.last_db = None;
        self.replicas.clear();
    }

    /// Follows a primary from now on (the data is kept until a sync).
    pub(crate) fn follow(&mut self, host: String, port: u16) {
        self.role = Role::Replica {
            host,
            port,
            link: LinkState::Connect,
        };
        self.replicas.clear();
    }

    /// The stream continues from a replica's point of view.
    pub(crate) fn applied(&mut self, entry: &ReplEntry) {
        self.offset = entry.end;
        // A replica keeps the entries too (it may be promoted, and its own
        // replicas continue from them).
        self.backlog.push_back(entry.clone());
        while self.backlog.len() > self.backlog_max {
            self.backlog.pop_front();
        }
        self.last_db = Some(entry.db);
    }

    /// A full resynchronisation: the stream restarts at the snapshot.
    pub(crate) fn loaded(&mut self, replid: String, offset: u64) {
        self.replid = replid;
        self.replid2 = None;
        self.offset = offset;
        self.backlog.clear();
        self.last_db = None;
    }

    /// Restarted empty: a new history.
    pub(crate) fn reset(&mut self) {
        self.role = Role::Primary;
        self.replid = self.new_replid();
        self.replid2 = None;
        self.offset = 0;
        self.backlog.clear();
        self.last_db = None;
        self.replicas.clear();
    }

    /// How many replicas acknowledged `offset` or later.
    pub(crate) fn acked(&self, offset: u64) -> usize {
        self.replicas
            .values()
            .filter(|acked| **acked >= offset)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(argv: &[&str]) -> Effect {
        Effect {
            db: 0,
            argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn offsets_count_resp_bytes_with_select_and_multi() {
        let mut r = Replication::new("n".into(), 10);
        // SELECT 0 (23 bytes) + SET a 1 (27 bytes)
        assert_eq!(r.feed(vec![effect(&["SET", "a", "1"])]), Some(23 + 27));
        // MULTI (15) + DEL a (20) + DEL b (20) + EXEC (14)
        let before = r.offset;
        r.feed(vec![effect(&["DEL", "a"]), effect(&["DEL", "b"])]);
        assert_eq!(r.offset - before, 15 + 20 + 20 + 14);
        assert_eq!(r.entries_since(before).unwrap().len(), 1);
        assert_eq!(r.entries_since(0).unwrap().len(), 2);
        assert!(r.entries_since(1).is_none());
    }
}
