//! The keyspace: databases of keys with their values and expiry times, on
//! deterministic ordered maps. A key whose time has passed is never
//! visible; whether it is also deleted (and the deletion propagated) when
//! found depends on the role of the node ([`ExpireMode`]), as in Redis.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How expired keys are treated when a command comes across them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExpireMode {
    /// A primary: an expired key is deleted when found, and the deletion
    /// is propagated to its replicas as `DEL`.
    Delete,
    /// A replica serving a client: an expired key is reported missing but
    /// kept, until its primary's `DEL` comes.
    Hide,
    /// A replica applying its primary's stream: nothing expires.
    Keep,
}

/// The time of one command on the node's own clock, and how it treats
/// expired keys. Time does not move during a command or a script.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    pub(crate) now_us: i64,
    pub(crate) mode: ExpireMode,
}

impl Clock {
    pub(crate) fn now_ms(&self) -> i64 {
        self.now_us.div_euclid(1000)
    }

    /// Whether a key with this expiry time is gone (`now > when`, as
    /// Redis's `keyIsExpired`).
    pub(crate) fn expired(&self, expire_ms: Option<i64>) -> bool {
        self.mode != ExpireMode::Keep && expire_ms.is_some_and(|when| self.now_ms() > when)
    }
}

/// A value of a key.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Str(Vec<u8>),
    List(VecDeque<Vec<u8>>),
    Hash(Hash),
    ZSet(ZSet),
}

impl Data {
    /// The name `TYPE` replies with.
    pub fn type_name(&self) -> &'static str {
        match self {
            Data::Str(_) => "string",
            Data::List(_) => "list",
            Data::Hash(_) => "hash",
            Data::ZSet(_) => "zset",
        }
    }
}

/// A key's value and its expiry time (ms on the node's clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub data: Data,
    pub expire_ms: Option<i64>,
}

/// One database.
#[derive(Clone, Debug, Default)]
pub(crate) struct Db {
    map: BTreeMap<Vec<u8>, Entry>,
    /// `SCAN` cursors handed out: where each resumes.
    cursors: BTreeMap<u64, Vec<u8>>,
    next_cursor: u64,
}

impl Db {
    /// The entry of `key`, live or not.
    pub(crate) fn peek(&self, key: &[u8]) -> Option<&Entry> {
        self.map.get(key)
    }

    pub(crate) fn peek_mut(&mut self, key: &[u8]) -> Option<&mut Entry> {
        self.map.get_mut(key)
    }

    pub(crate) fn insert(&mut self, key: Vec<u8>, entry: Entry) {
        self.map.insert(key, entry);
    }

    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Entry> {
        self.map.remove(key)
    }

    /// Every key, live or not (for `SCAN`, which then looks each up).
    pub(crate) fn raw_keys(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.map.keys()
    }

    /// The keys at or after `from` in the map's order, at most `count`.
    pub(crate) fn raw_keys_from(&self, from: &[u8], count: usize) -> Vec<Vec<u8>> {
        self.map
            .range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded))
            .take(count)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The live entries (nothing deleted).
    pub(crate) fn live<'a>(
        &'a self,
        clock: &'a Clock,
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a Entry)> + 'a {
        self.map
            .iter()
            .filter(move |(_, entry)| !clock.expired(entry.expire_ms))
    }

    /// Keys whose time has passed (for active expiry).
    pub(crate) fn expired_keys(&self, clock: &Clock) -> Vec<Vec<u8>> {
        self.map
            .iter()
            .filter(|(_, entry)| clock.expired(entry.expire_ms))
            .map(|(key, _)| key.clone())
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }

    /// A new `SCAN` cursor resuming at `key` (at most 1024 are kept: the
    /// oldest is forgotten).
    pub(crate) fn add_cursor(&mut self, key: Vec<u8>) -> u64 {
        self.next_cursor += 1;
        self.cursors.insert(self.next_cursor, key);
        if self.cursors.len() > 1024 {
            self.cursors.pop_first();
        }
        self.next_cursor
    }

    /// Where `cursor` resumes (a cursor can be used again: a client
    /// retries a `SCAN` whose reply it lost).
    pub(crate) fn cursor(&self, cursor: u64) -> Option<Vec<u8>> {
        self.cursors.get(&cursor).cloned()
    }
}

/// A hash: fields in the order they were first set, as a small hash
/// (listpack) keeps them in Redis. (A large one, past 128 fields or 64-byte
/// values, is a hash table there, with its own order.)
#[derive(Clone, Debug, Default)]
pub struct Hash {
    fields: BTreeMap<Vec<u8>, (u64, Vec<u8>)>,
    order: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl PartialEq for Hash {
    fn eq(&self, other: &Hash) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Hash {
    /// Sets a field; whether it is new.
    pub(crate) fn set(&mut self, field: &[u8], value: &[u8]) -> bool {
        match self.fields.get_mut(field) {
            Some((_, old)) => {
                *old = value.to_vec();
                false
            }
            None => {
                self.fields
                    .insert(field.to_vec(), (self.next, value.to_vec()));
                self.order.insert(self.next, field.to_vec());
                self.next += 1;
                true
            }
        }
    }

    pub(crate) fn get(&self, field: &[u8]) -> Option<&Vec<u8>> {
        self.fields.get(field).map(|(_, value)| value)
    }

    /// Deletes a field; whether it was there.
    pub(crate) fn remove(&mut self, field: &[u8]) -> bool {
        match self.fields.remove(field) {
            Some((seq, _)) => {
                self.order.remove(&seq);
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Fields and values, in the order the fields were first set.
    pub fn iter(&self) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> {
        self.order
            .values()
            .map(|field| (field, &self.fields[field].1))
    }
}

/// A score: ordered as Redis compares scores (`-0` equals `0`; never NaN).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Score(pub(crate) f64);

impl PartialEq for Score {
    fn eq(&self, other: &Score) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Score) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Score) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

/// A sorted set: members ordered by score, then by member bytes.
#[derive(Clone, Debug, Default)]
pub struct ZSet {
    scores: BTreeMap<Vec<u8>, f64>,
    ordered: BTreeSet<(Score, Vec<u8>)>,
}

impl PartialEq for ZSet {
    fn eq(&self, other: &ZSet) -> bool {
        self.scores.len() == other.scores.len()
            && self.scores.iter().all(|(m, s)| {
                other
                    .scores
                    .get(m)
                    .is_some_and(|o| o.to_bits() == s.to_bits())
            })
    }
}

impl ZSet {
    pub(crate) fn score(&self, member: &[u8]) -> Option<f64> {
        self.scores.get(member).copied()
    }

    /// Sets a member's score; whether it is new.
    pub(crate) fn insert(&mut self, member: &[u8], score: f64) -> bool {
        match self.scores.get_mut(member) {
            Some(old) => {
                if old.to_bits() != score.to_bits() {
                    self.ordered.remove(&(Score(*old), member.to_vec()));
                    self.ordered.insert((Score(score), member.to_vec()));
                    *old = score;
                }
                false
            }
            None => {
                self.scores.insert(member.to_vec(), score);
                self.ordered.insert((Score(score), member.to_vec()));
                true
            }
        }
    }

    pub(crate) fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(score) => {
                self.ordered.remove(&(Score(score), member.to_vec()));
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.scores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Members and scores, lowest score first (ties by member).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Vec<u8>, f64)> {
        self.ordered.iter().map(|(score, member)| (member, score.0))
    }
}
