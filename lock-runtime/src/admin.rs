//! Inspecting and force-releasing locks: what the `lockctl` command does,
//! as methods of [`Client`] ([`Client::inspect`], [`Client::lock_info`],
//! [`Client::release_holder`], [`Client::force_release`]).
//!
//! Reading is one script per lock name (`inspect.lua`: a consistent
//! snapshot of the name's exclusive lock, read/write lock and semaphore,
//! which are three separate locks), and listing is `SCAN` with a `MATCH`
//! pattern, on every primary of a Redis Cluster. Nothing here writes,
//! except a release, which is the lock's own owner-checked release script
//! run on the holder's behalf: it frees the lock only if that holder still
//! holds it, and wakes queued waiters exactly as the holder's own release
//! would.
//!
//! ```no_run
//! # async fn example(client: lock_runtime::Client) -> Result<(), lock_runtime::LockError> {
//! use lock_runtime::admin::{LockKind, ReleaseOutcome};
//!
//! for lock in client.inspect("order:").await? {
//!     println!("{} {} waiters={}", lock.name, lock.kind, lock.waiters);
//! }
//! for released in client.force_release("order:42", LockKind::Exclusive).await? {
//!     if released.outcome == ReleaseOutcome::HolderChanged {
//!         println!("{} no longer held it: nothing released", released.holder.token_head());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! **Over a quorum** (RedLock, `redis-quorum://`), every node is scanned and
//! read on its own and the readings are merged per lock: a holder's
//! [`Holder::nodes`] says on how many nodes its token was found, and only a
//! holder found on a majority holds the lock ([`LockInfo::holding`]); a
//! token on a minority is an attempt that failed (being given back) or is
//! under way. Every node must answer.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::stream::{self, StreamExt, TryStreamExt};

use crate::backend::{Found, Kind, Snapshot};
use crate::client::Client;
use crate::error::{ConfigError, LockError};
use crate::keys::LockKeys;
use crate::lease::holders::{
    hold_field, record_key, FIELD_HOST, FIELD_INSTANCE, FIELD_PID, FIELD_STARTED, FIELD_VERSION,
};
use crate::token::client_of;

/// Keys asked for per `SCAN` step.
const SCAN_COUNT: u32 = 1000;

/// Lock names read at once by [`Client::inspect`].
const READS_AT_ONCE: usize = 32;

/// Which primitive a lock is. One name can be used by all three at once:
/// they are separate locks with separate keys (`lock:{name}`,
/// `lock:{name}:rw`, `lock:{name}:sem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// [`Lock`](crate::Lock): one holder at a time.
    Exclusive,
    /// [`RwLock`](crate::RwLock): one writer, or many readers.
    ReadWrite,
    /// [`Semaphore`](crate::Semaphore): permits up to a capacity.
    Semaphore,
}

impl LockKind {
    /// The short name lockctl shows: `lock`, `rw`, `semaphore`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Exclusive => "lock",
            LockKind::ReadWrite => "rw",
            LockKind::Semaphore => "semaphore",
        }
    }

    /// What follows the hash tag in the kind's keys.
    fn suffix(self) -> &'static str {
        match self {
            LockKind::Exclusive => "",
            LockKind::ReadWrite => ":rw",
            LockKind::Semaphore => ":sem",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LockKind {
    type Err = LockError;

    /// `lock` (or `exclusive`), `rw` (or `read-write`), `semaphore` (or
    /// `sem`).
    fn from_str(text: &str) -> Result<Self, LockError> {
        match text.to_ascii_lowercase().as_str() {
            "lock" | "exclusive" => Ok(LockKind::Exclusive),
            "rw" | "read-write" | "rwlock" => Ok(LockKind::ReadWrite),
            "semaphore" | "sem" => Ok(LockKind::Semaphore),
            _ => Err(ConfigError::InvalidLockOption {
                name: String::new(),
                option: "kind",
                reason: format!("unknown lock kind `{text}`: give `lock`, `rw` or `semaphore`"),
            }
            .into()),
        }
    }
}

/// How a holder holds its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HolderRole {
    /// Holds an exclusive lock.
    Owner,
    /// Released an exclusive lock taken with `hold_at_least`, which keeps it
    /// until its ttl passes (no renewal; nobody else may take it meanwhile).
    Kept,
    /// Holds the write side of a read/write lock.
    Writer,
    /// Released a write side taken with `hold_at_least`, kept until its ttl
    /// passes. A force release cannot end it early.
    KeptWriter,
    /// Holds a read share of a read/write lock.
    Reader,
    /// Holds this many permits of a semaphore.
    Permits(u32),
}

impl fmt::Display for HolderRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HolderRole::Owner => f.write_str("owner"),
            HolderRole::Kept => f.write_str("kept by hold_at_least"),
            HolderRole::Writer => f.write_str("writer"),
            HolderRole::KeptWriter => f.write_str("writer kept by hold_at_least"),
            HolderRole::Reader => f.write_str("reader"),
            HolderRole::Permits(1) => f.write_str("1 permit"),
            HolderRole::Permits(k) => write!(f, "{k} permits"),
        }
    }
}

/// One holder of a lock, as Redis has it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's token: 32 hex digits, what
    /// [`HeldLock::token`](crate::HeldLock::token) returns in the holder's
    /// process.
    pub token: String,
    /// How it holds the lock.
    pub role: HolderRole,
    /// The time left before its key or share expires, on the Redis
    /// server's clock (over a quorum: the shortest on the nodes that have
    /// it); `None` if it has no expiry.
    pub ttl: Option<Duration>,
    /// On how many nodes the token was found: 1 on one server or a cluster;
    /// over a quorum, the holder holds the lock only when this is a
    /// majority.
    pub nodes: usize,
    /// Who the holder is, from its client's holder record: its instance,
    /// host and process, and (once it has held the lock for a second) the
    /// function that took it and since when. `None` when there is no
    /// record: its process has not refreshed it for a minute (it died, or
    /// cannot reach Redis), its client runs a version of this crate
    /// without records, or its Redis user may not write it.
    pub record: Option<HolderRecord>,
}

/// Who holds a lock, as the holder's client wrote it in its holder record
/// (`<prefix>client:{<client id>}`, written in the background while the
/// client holds locks; [design §1](https://github.com/lock-runtime/lock-runtime/blob/main/docs/design.md)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderRecord {
    /// The client's id: the last 16 hex digits of its tokens
    /// ([`Client::id`]).
    pub client: String,
    /// The name of the holder's process: [`Config::instance`](crate::Config::instance),
    /// by default `<host name>:<pid>`.
    pub instance: String,
    /// The host name of the holder's machine.
    pub host: String,
    /// The holder's process id, on that host.
    pub pid: Option<u32>,
    /// The version of this crate in the holder's process.
    pub version: String,
    /// When the holder's client was built (its clock).
    pub client_started: Option<SystemTime>,
    /// The function that took the lock: the annotated function's path
    /// (`my_service::orders::settle`), or what the manual API gave to
    /// [`Lock::caller`](crate::Lock::caller). `None` when the lock was taken
    /// without one, or its hold is not in the record (yet: a hold is
    /// written once it has been held for a second).
    pub function: Option<String>,
    /// When the lock was taken (the holder's clock), when its hold is in
    /// the record.
    pub since: Option<SystemTime>,
}

impl Holder {
    /// The first 8 hex digits of the token: enough to tell holders apart
    /// in a listing (the holder's process logs its full token).
    pub fn token_head(&self) -> &str {
        let end = self
            .token
            .char_indices()
            .nth(8)
            .map_or(self.token.len(), |(at, _)| at);
        &self.token[..end]
    }
}

/// What Redis holds for one lock: its holders, waiters and fencing counter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name, as its users give it (`order:42`).
    pub name: String,
    /// Which primitive it is.
    pub kind: LockKind,
    /// Its main Redis key (`lock:{order:42}`, `lock:{order:42}:rw`, ...).
    pub key: String,
    /// Its holders: none (free, but waiters or a fencing counter left), one,
    /// or for readers and semaphores several. Over a quorum, also tokens
    /// found on a minority of nodes, which do not hold it (see
    /// [`LockInfo::holding`]).
    pub holders: Vec<Holder>,
    /// Queued waiters whose place has not expired (over a quorum, where
    /// each waiter queues on every node: the most queued on one node).
    pub waiters: u64,
    /// The last fencing token handed out for it, while its fence key lives
    /// (a minute, or the ttl if longer, after each acquisition with
    /// `fencing`); `None` if it was never taken with `fencing` lately. Over
    /// a quorum, the largest token a majority of its nodes have reached (a
    /// node that granted a late attempt may keep a larger number that no
    /// holder was given).
    pub fencing_token: Option<u64>,
    /// A semaphore's capacity while anybody holds it.
    pub capacity: Option<u32>,
    /// The nodes read: 1 for one server or a cluster, N for a quorum.
    pub nodes: usize,
}

impl LockInfo {
    /// The holders that hold the lock: all of them, except over a quorum,
    /// where only those found on a majority of its nodes.
    pub fn holding(&self) -> impl Iterator<Item = &Holder> {
        let majority = self.nodes / 2 + 1;
        self.holders
            .iter()
            .filter(move |holder| holder.nodes >= majority)
    }

    /// Whether anybody holds the lock now.
    pub fn is_held(&self) -> bool {
        self.holding().next().is_some()
    }

    /// The longest time left of its holders (`None`: free, or no expiry).
    pub fn ttl(&self) -> Option<Duration> {
        self.holding().filter_map(|holder| holder.ttl).max()
    }

    /// Permits held in all, for a semaphore.
    pub fn permits_held(&self) -> u32 {
        self.holding()
            .map(|holder| match holder.role {
                HolderRole::Permits(k) => k,
                _ => 0,
            })
            .sum()
    }
}

/// What a release on a holder's behalf did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The holder still held the lock, and it is released: its key or share
    /// is gone and the waiters its release wakes were woken.
    /// `woke_waiter`: an exclusive lock's release told a queued waiter of a
    /// live client (the shared kinds wake theirs without saying).
    Released {
        /// Whether the release told a waiting client.
        woke_waiter: bool,
    },
    /// The holder's key or share was already gone (it expired, or its
    /// holder released it meanwhile, or an earlier attempt of this same
    /// call that got no answer did): nothing was done.
    Gone,
    /// Another holder holds the lock now (it changed hands since it was
    /// read): nothing was done, the new holder keeps it.
    HolderChanged,
}

impl fmt::Display for ReleaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReleaseOutcome::Released { woke_waiter: true } => {
                f.write_str("released; a waiting client was woken")
            }
            ReleaseOutcome::Released { woke_waiter: false } => f.write_str("released"),
            ReleaseOutcome::Gone => {
                f.write_str("nothing released: the holder's lock was already gone (expired or released)")
            }
            ReleaseOutcome::HolderChanged => f.write_str(
                "nothing released: the lock changed hands since it was read; the new holder keeps it",
            ),
        }
    }
}

/// One holder a [`Client::force_release`] released, or tried to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The holder, as read before the release.
    pub holder: Holder,
    /// What its release did.
    pub outcome: ReleaseOutcome,
}

impl Client {
    /// Every lock whose name starts with `prefix` (`""`: all), with its
    /// holders, waiters and fencing counter, sorted by name and kind.
    ///
    /// Lists keys with `SCAN … MATCH <key prefix>{<prefix>* COUNT 1000`
    /// (never `KEYS`): on a Redis Cluster on every primary, over a quorum on
    /// every node (see the [module](crate::admin) documentation). Then each
    /// name found is read with one script call (32 at a time). As with any
    /// `SCAN`, a lock taken or released during the listing may be missed,
    /// and a cluster resharded meanwhile may be listed incompletely. A lock
    /// whose keys all vanished between the scan and its reading is left
    /// out.
    ///
    /// # Errors
    ///
    /// [`LockError::Redis`] when a node cannot be reached or refuses a
    /// command (with an ACL, the user needs `+scan` and `+zcount` beside
    /// the library's own rule, see the guide, Configuration); over a quorum every node
    /// must answer. [`LockError::Config`] for a prefix containing `{` or
    /// `}`.
    pub async fn inspect(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        if prefix.contains(['{', '}']) {
            return Err(ConfigError::InvalidName {
                name: prefix.to_owned(),
                reason: "a lock name prefix must not contain `{` or `}`: give the start of lock \
                         names (`order:`), not of Redis keys"
                    .to_owned(),
            }
            .into());
        }
        let key_prefix = self.key_prefix();
        let pattern = format!("{}{{{}*", glob_escape(key_prefix), glob_escape(prefix));
        let found = match self.core().backend().scan(&pattern, SCAN_COUNT).await {
            Ok(found) => found,
            // Named by the lock names asked for, not the key pattern.
            Err(LockError::Redis {
                operation,
                server,
                source,
                ..
            }) => {
                return Err(LockError::Redis {
                    name: format!("{prefix}*"),
                    operation,
                    server,
                    source,
                })
            }
            Err(error) => return Err(error),
        };
        let names: BTreeSet<String> = found
            .iter()
            .flatten()
            .filter_map(|key| lock_name(key_prefix, key))
            .filter(|name| name.starts_with(prefix))
            .collect();
        let mut locks: Vec<LockInfo> = stream::iter(names)
            .map(|name| async move { self.read_locks(&name).await })
            .buffered(READS_AT_ONCE)
            .try_concat()
            .await?;
        locks.sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
        self.attach_records(&mut locks).await?;
        Ok(locks)
    }

    /// The locks called `name` that have keys in Redis: its exclusive lock,
    /// read/write lock and semaphore are three separate locks, so up to
    /// three entries, usually one; none when all are free (and have no
    /// waiters or fencing counter left). One script call reads them all at
    /// once (over a quorum, one per node, merged).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for an invalid name (empty, too long, starting
    /// with `}`); [`LockError::Redis`] when Redis cannot be reached or
    /// refuses the script (with an ACL, the user needs `+zcount` beside the
    /// library's own rule).
    pub async fn lock_info(&self, name: &str) -> Result<Vec<LockInfo>, LockError> {
        let mut locks = self.read_locks(name).await?;
        self.attach_records(&mut locks).await?;
        Ok(locks)
    }

    /// Who each holder of `locks` is ([`Holder::record`]): one `HGETALL`
    /// per holders' client (over a quorum, on every node, merged).
    async fn attach_records(&self, locks: &mut [LockInfo]) -> Result<(), LockError> {
        let clients: BTreeSet<String> = locks
            .iter()
            .flat_map(|lock| &lock.holders)
            .filter_map(|holder| client_of(&holder.token).map(str::to_owned))
            .collect();
        let prefix = self.key_prefix();
        let records: HashMap<String, Vec<(String, String)>> = stream::iter(clients)
            .map(|client| async move {
                let key = record_key(prefix, &client);
                let fields = self.core().backend().read_record(&key).await?;
                Ok::<_, LockError>((client, fields))
            })
            .buffered(READS_AT_ONCE)
            .try_collect()
            .await?;
        for holder in locks.iter_mut().flat_map(|lock| &mut lock.holders) {
            holder.record = client_of(&holder.token)
                .and_then(|client| Some((client, records.get(client)?)))
                .and_then(|(client, fields)| parse_record(client, fields, &holder.token));
        }
        Ok(())
    }

    /// The locks of `name` as Redis has them, without their holders'
    /// records.
    async fn read_locks(&self, name: &str) -> Result<Vec<LockInfo>, LockError> {
        let prefix = self.key_prefix();
        let exclusive = LockKeys::new(prefix, name, "")?;
        let rw = LockKeys::new(prefix, name, LockKind::ReadWrite.suffix())?;
        let semaphore = LockKeys::new(prefix, name, LockKind::Semaphore.suffix())?;
        let keys = [
            exclusive.lock.clone(),
            exclusive.fence().to_string(),
            exclusive.waiters().to_string(),
            rw.lock.clone(),
            rw.readers().to_string(),
            rw.waiters().to_string(),
            rw.fence().to_string(),
            semaphore.lock.clone(),
            semaphore.waiters().to_string(),
        ];
        let snapshots = self.core().backend().inspect(name, &keys).await?;
        let nodes = snapshots.len();
        let mut locks = Vec::new();
        for kind in [
            LockKind::Exclusive,
            LockKind::ReadWrite,
            LockKind::Semaphore,
        ] {
            let key = match kind {
                LockKind::Exclusive => &exclusive.lock,
                LockKind::ReadWrite => &rw.lock,
                LockKind::Semaphore => &semaphore.lock,
            };
            let read: Vec<LockInfo> = snapshots
                .iter()
                .filter_map(|snapshot| read_kind(snapshot, kind, name, key))
                .collect();
            if let Some(lock) = merge(read, nodes) {
                locks.push(lock);
            }
        }
        Ok(locks)
    }

    /// Releases `holder`'s hold on the lock `name` of `kind` as that holder
    /// would release it itself: one call of the lock's own release script
    /// with the holder's token, which frees the lock only if the holder
    /// still holds it (compare-and-delete, atomic in Redis) and wakes the
    /// queued waiters as a normal release does. A lock that changed hands
    /// since `holder` was read is left to its new holder
    /// ([`ReleaseOutcome::HolderChanged`]). Over a quorum the release goes
    /// to every node, and counts when a majority held the token.
    ///
    /// The holder's process, if it still runs, is not told at once: its
    /// next renewal (with `renew`) finds the lock gone and reports it lost
    /// (stopping its body with the default `on_lost`), or its own release
    /// returns [`LockError::Lost`]. Until then it may still be running its
    /// critical section beside the next holder: force-release only a
    /// holder known to be dead or stuck.
    ///
    /// The release is logged (`tracing`, at `warn` when something was
    /// released, `info` otherwise).
    ///
    /// # Errors
    ///
    /// [`LockError::Redis`] when Redis cannot be reached (the outcome is then
    /// unknown: read the lock again); [`LockError::Config`] for an invalid
    /// name, a holder of another kind of lock, or a kept writer
    /// ([`HolderRole::KeptWriter`], which only its ttl ends).
    pub async fn release_holder(
        &self,
        name: &str,
        kind: LockKind,
        holder: &Holder,
    ) -> Result<ReleaseOutcome, LockError> {
        let keys = LockKeys::new(self.key_prefix(), name, kind.suffix())?;
        let kept;
        let (backend_kind, token) = match (kind, holder.role) {
            (LockKind::Exclusive, HolderRole::Owner) => (Kind::Exclusive, holder.token.as_str()),
            // The kept value, compared and deleted whole (with the wake
            // mark a waiter may have added to it).
            (LockKind::Exclusive, HolderRole::Kept) => {
                kept = format!("kept:{}", holder.token);
                (Kind::Exclusive, kept.as_str())
            }
            (LockKind::ReadWrite, HolderRole::Writer) => (Kind::Write, holder.token.as_str()),
            (LockKind::ReadWrite, HolderRole::Reader) => (Kind::Read, holder.token.as_str()),
            (LockKind::ReadWrite, HolderRole::KeptWriter) => {
                return Err(ConfigError::Unsupported {
                    name: name.to_owned(),
                    reason: "this read/write lock is kept by `hold_at_least` after its writer \
                             released it; it cannot be released early: it frees itself when \
                             its ttl passes",
                }
                .into())
            }
            // Wakes every waiter whose permits fit (a fair semaphore's
            // waiters re-check their turn when they try).
            (LockKind::Semaphore, HolderRole::Permits(permits)) => (
                Kind::Semaphore {
                    capacity: 0,
                    permits,
                    fair: false,
                },
                holder.token.as_str(),
            ),
            (kind, role) => {
                return Err(ConfigError::InvalidLockOption {
                    name: name.to_owned(),
                    option: "kind",
                    reason: format!(
                        "a holder of role `{role}` cannot hold a `{kind}` lock: give the holder \
                         and kind as `lock_info` read them"
                    ),
                }
                .into())
            }
        };
        let release = self
            .core()
            .backend()
            .release(backend_kind, &keys, token, 0)
            .await?;
        let outcome = match release.found {
            Found::Mine => ReleaseOutcome::Released {
                woke_waiter: release.woke,
            },
            Found::Gone => ReleaseOutcome::Gone,
            Found::Other => ReleaseOutcome::HolderChanged,
        };
        if matches!(outcome, ReleaseOutcome::Released { .. }) {
            tracing::warn!(
                lock = %name, kind = %kind, holder = %holder.token_head(), role = %holder.role,
                "force-released on the holder's behalf: {outcome}"
            );
        } else {
            tracing::info!(
                lock = %name, kind = %kind, holder = %holder.token_head(),
                "force release: {outcome}"
            );
        }
        Ok(outcome)
    }

    /// Frees the lock `name` of `kind` from its current holders: reads it
    /// ([`Client::lock_info`]), then releases each holder on its behalf
    /// ([`Client::release_holder`]: owner-checked, so a holder that changed
    /// in between keeps the lock, and waiters are woken as by a normal
    /// release). Empty when nobody holds it. A kept writer
    /// ([`HolderRole::KeptWriter`]) is not released (an error).
    ///
    /// Read [`Client::release_holder`] first: the holders' processes are
    /// not stopped, only told at their next renewal or release.
    ///
    /// # Errors
    ///
    /// As [`Client::lock_info`] and [`Client::release_holder`]; an error
    /// after some holders were released leaves them released.
    pub async fn force_release(
        &self,
        name: &str,
        kind: LockKind,
    ) -> Result<Vec<ForcedRelease>, LockError> {
        let locks = self.lock_info(name).await?;
        let Some(lock) = locks.into_iter().find(|lock| lock.kind == kind) else {
            return Ok(Vec::new());
        };
        let mut released = Vec::new();
        for holder in lock.holding() {
            let outcome = self.release_holder(name, kind, holder).await?;
            released.push(ForcedRelease {
                holder: holder.clone(),
                outcome,
            });
        }
        Ok(released)
    }
}

/// `text` with the `SCAN` pattern's special characters escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The suffixes (after the name's closing `}`) of every key a lock uses.
const SUFFIXES: &[&str] = &[
    "",
    ":fence",
    ":queue",
    ":tickets",
    ":waiters",
    ":rw",
    ":rw:readers",
    ":rw:queue",
    ":rw:waiters",
    ":rw:fence",
    ":sem",
    ":sem:queue",
    ":sem:waiters",
];

/// The lock name a key of this library belongs to: `<prefix>{<name>}<suffix>`
/// with a known suffix; `None` for any other key. No suffix contains `}`,
/// so at most one of them (with its `}`) ends a key.
fn lock_name(prefix: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    SUFFIXES.iter().find_map(|suffix| {
        let name = rest.strip_suffix(suffix)?.strip_suffix('}')?;
        (!name.is_empty() && !name.starts_with('}')).then(|| name.to_owned())
    })
}

/// The holder record's `fields` (of the client `client`), for the holder
/// whose token is `token`; `None` when there is no record.
fn parse_record(client: &str, fields: &[(String, String)], token: &str) -> Option<HolderRecord> {
    if fields.is_empty() {
        return None;
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    };
    let at = |ms: &str| {
        ms.parse::<u64>()
            .ok()
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    };
    // `<taken at ms>|<kind>|<function>|<name>`.
    let hold = field(&hold_field(token)).map(|value| value.splitn(4, '|').collect::<Vec<_>>());
    let function = hold
        .as_ref()
        .and_then(|parts| parts.get(2))
        .filter(|function| !function.is_empty())
        .map(|function| (*function).to_owned());
    let since = hold
        .as_ref()
        .and_then(|parts| parts.first())
        .and_then(|ms| at(ms));
    Some(HolderRecord {
        client: client.to_owned(),
        instance: field(FIELD_INSTANCE).unwrap_or("unknown").to_owned(),
        host: field(FIELD_HOST).unwrap_or("unknown").to_owned(),
        pid: field(FIELD_PID).and_then(|pid| pid.parse().ok()),
        version: field(FIELD_VERSION).unwrap_or("unknown").to_owned(),
        client_started: field(FIELD_STARTED).and_then(at),
        function,
        since,
    })
}

/// Milliseconds left, `None` for a negative `PTTL` (no key, no expiry).
fn millis(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// What one node's snapshot says of the lock of `kind`; `None` if it has
/// nothing of it (no holder, no live waiter, no fencing counter).
fn read_kind(snapshot: &Snapshot, kind: LockKind, name: &str, key: &str) -> Option<LockInfo> {
    let holder = |token: &str, role, ttl| Holder {
        token: token.to_owned(),
        role,
        ttl,
        nodes: 1,
        record: None,
    };
    // A share's expiry on the server clock.
    let left = |expiry: f64| {
        let ms = expiry - snapshot.now_ms as f64;
        (ms > 0.0).then(|| Duration::from_millis(ms.min(u64::MAX as f64) as u64))
    };
    let mut lock = LockInfo {
        name: name.to_owned(),
        kind,
        key: key.to_owned(),
        holders: Vec::new(),
        waiters: 0,
        fencing_token: None,
        capacity: None,
        nodes: 1,
    };
    match kind {
        LockKind::Exclusive => {
            let state = &snapshot.exclusive;
            if let Some(value) = &state.value {
                // The owner before any wake mark or quorum attempt mark.
                let owner = value.split('|').next().unwrap_or(value);
                let ttl = millis(state.pttl_ms);
                lock.holders.push(match owner.strip_prefix("kept:") {
                    Some(token) => holder(token, HolderRole::Kept, ttl),
                    None => holder(owner, HolderRole::Owner, ttl),
                });
            }
            lock.waiters = state.waiters;
            lock.fencing_token = state.fence;
        }
        LockKind::ReadWrite => {
            let state = &snapshot.rw;
            let ttl = millis(state.pttl_ms);
            match state.writer.as_deref() {
                None | Some("q") => {}
                Some(value) => lock
                    .holders
                    .push(if let Some(token) = value.strip_prefix("r:") {
                        holder(token, HolderRole::Reader, ttl)
                    } else if let Some(token) = value.strip_prefix("kept:") {
                        holder(token, HolderRole::KeptWriter, ttl)
                    } else {
                        holder(value, HolderRole::Writer, ttl)
                    }),
            }
            for (token, expiry) in &state.readers {
                if let Some(ttl) = left(*expiry) {
                    lock.holders
                        .push(holder(token, HolderRole::Reader, Some(ttl)));
                }
            }
            lock.waiters = state.waiters;
            lock.fencing_token = state.fence;
        }
        LockKind::Semaphore => {
            let state = &snapshot.semaphore;
            for (member, expiry) in &state.members {
                if let Some(capacity) = member.strip_prefix("#capacity:") {
                    lock.capacity = capacity.parse().ok();
                    continue;
                }
                let Some((permits, token)) = member.split_once('|') else {
                    continue;
                };
                if let (Ok(permits), Some(ttl)) = (permits.parse(), left(*expiry)) {
                    lock.holders
                        .push(holder(token, HolderRole::Permits(permits), Some(ttl)));
                }
            }
            lock.waiters = state.waiters;
        }
    }
    let anything = !lock.holders.is_empty() || lock.waiters > 0 || lock.fencing_token.is_some();
    anything.then_some(lock)
}

/// The readings of one lock from `nodes` nodes merged into one: holders by
/// token (counted per node, their shortest ttl), the largest fencing token
/// and waiter count. `None` when no node had anything of it.
fn merge(read: Vec<LockInfo>, nodes: usize) -> Option<LockInfo> {
    let mut read = read.into_iter();
    let mut merged = read.next()?;
    merged.nodes = nodes;
    let mut fences: Vec<u64> = merged.fencing_token.into_iter().collect();
    for lock in read {
        merged.waiters = merged.waiters.max(lock.waiters);
        fences.extend(lock.fencing_token);
        merged.capacity = merged.capacity.or(lock.capacity);
        for holder in lock.holders {
            match merged
                .holders
                .iter_mut()
                .find(|known| known.token == holder.token && known.role == holder.role)
            {
                Some(known) => {
                    known.nodes += 1;
                    known.ttl = match (known.ttl, holder.ttl) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => merged.holders.push(holder),
            }
        }
    }
    merged.fencing_token = majority_fence(fences, nodes);
    // The holders found on most nodes first.
    merged
        .holders
        .sort_by_key(|holder| std::cmp::Reverse(holder.nodes));
    Some(merged)
}

/// The last fencing token a quorum of `nodes` handed out: the largest value
/// a majority of its nodes have reached. An acquisition's write-back raises
/// a majority to its token, but a node that granted a late attempt (after
/// the write-back, or one given back) counts on from its own clock, to a
/// number no holder was given: the largest value alone would show that.
/// With fewer nodes keeping a fence, the largest one kept; on one server,
/// its value.
fn majority_fence(mut fences: Vec<u64>, nodes: usize) -> Option<u64> {
    fences.sort_unstable_by(|a, b| b.cmp(a));
    let majority = nodes / 2 + 1;
    fences.get(majority - 1).or(fences.first()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ExclusiveState, RwState, SemaphoreState};

    #[test]
    fn finds_the_lock_name_of_every_key() {
        for (key, name) in [
            ("lock:{order:42}", Some("order:42")),
            ("lock:{order:42}:fence", Some("order:42")),
            ("lock:{order:42}:rw:readers", Some("order:42")),
            ("lock:{order:42}:sem:waiters", Some("order:42")),
            ("lock:{a}b{c}", Some("a}b{c")),
            ("lock:{a}b{c}:queue", Some("a}b{c")),
            ("lock:{x}:rw}:rw:queue", Some("x}:rw")),
            ("lock:{order:42}:other", None),
            ("lock:{}", None),
            ("other:{order:42}", None),
            ("lock:order", None),
        ] {
            assert_eq!(lock_name("lock:", key).as_deref(), name, "{key}");
        }
    }

    #[test]
    fn reads_a_holder_record() {
        let token = "0123456789abcdefaaaaaaaaaaaaaaaa";
        assert_eq!(client_of(token), Some("aaaaaaaaaaaaaaaa"));
        let fields: Vec<(String, String)> = [
            ("client", "aaaaaaaaaaaaaaaa"),
            ("instance", "web-1"),
            ("host", "h1"),
            ("pid", "42"),
            ("started_ms", "1000"),
            ("version", "0.1.0"),
            ("h:0123456789abcdef", "5000|lock|app::settle|order:a|b"),
        ]
        .into_iter()
        .map(|(field, value)| (field.to_owned(), value.to_owned()))
        .collect();
        let record = parse_record("aaaaaaaaaaaaaaaa", &fields, token).unwrap();
        assert_eq!(record.instance, "web-1");
        assert_eq!((record.host.as_str(), record.pid), ("h1", Some(42)));
        assert_eq!(record.function.as_deref(), Some("app::settle"));
        assert_eq!(record.since, Some(UNIX_EPOCH + Duration::from_secs(5)));
        assert_eq!(
            record.client_started,
            Some(UNIX_EPOCH + Duration::from_secs(1))
        );
        // Another hold of the same client: known process, unknown function.
        let other = parse_record(
            "aaaaaaaaaaaaaaaa",
            &fields,
            "ffffffffffffffffaaaaaaaaaaaaaaaa",
        )
        .unwrap();
        assert_eq!((other.function, other.since), (None, None));
        assert!(parse_record("aaaaaaaaaaaaaaaa", &[], token).is_none());
    }

    #[test]
    fn escapes_scan_patterns() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("order:"), "order:");
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            now_ms: 10_000,
            exclusive: ExclusiveState {
                value: Some("0123456789abcdef|lock-waiters:x|fedc".to_owned()),
                pttl_ms: 2_500,
                fence: Some(7),
                waiters: 1,
            },
            rw: RwState {
                writer: Some("r:aa".to_owned()),
                pttl_ms: 900,
                readers: vec![("bb".to_owned(), 12_000.0), ("dead".to_owned(), 9_000.0)],
                fence: None,
                waiters: 0,
            },
            semaphore: SemaphoreState {
                pttl_ms: 5_000,
                members: vec![
                    ("2|cc".to_owned(), 15_000.0),
                    ("#capacity:5".to_owned(), f64::INFINITY),
                ],
                waiters: 3,
            },
        }
    }

    #[test]
    fn reads_each_kind_from_a_snapshot() {
        let snapshot = snapshot();
        let lock = read_kind(&snapshot, LockKind::Exclusive, "n", "lock:{n}").unwrap();
        assert_eq!(lock.holders.len(), 1);
        assert_eq!(lock.holders[0].token, "0123456789abcdef");
        assert_eq!(lock.holders[0].token_head(), "01234567");
        assert_eq!(lock.holders[0].role, HolderRole::Owner);
        assert_eq!(lock.ttl(), Some(Duration::from_millis(2_500)));
        assert_eq!((lock.waiters, lock.fencing_token), (1, Some(7)));

        let rw = read_kind(&snapshot, LockKind::ReadWrite, "n", "lock:{n}:rw").unwrap();
        let readers: Vec<&str> = rw.holders.iter().map(|h| h.token.as_str()).collect();
        assert_eq!(readers, ["aa", "bb"], "the dead share is left out");
        assert!(rw.holders.iter().all(|h| h.role == HolderRole::Reader));
        assert_eq!(rw.ttl(), Some(Duration::from_millis(2_000)));

        let semaphore = read_kind(&snapshot, LockKind::Semaphore, "n", "lock:{n}:sem").unwrap();
        assert_eq!(semaphore.capacity, Some(5));
        assert_eq!(semaphore.permits_held(), 2);
        assert_eq!(semaphore.waiters, 3);

        let mut kept = snapshot.clone();
        kept.exclusive.value = Some("kept:abc|lock-waiters:x|d".to_owned());
        kept.rw = RwState {
            writer: Some("q".to_owned()),
            waiters: 2,
            ..RwState::default()
        };
        let lock = read_kind(&kept, LockKind::Exclusive, "n", "k").unwrap();
        assert_eq!(
            (lock.holders[0].token.as_str(), lock.holders[0].role),
            ("abc", HolderRole::Kept)
        );
        let gate = read_kind(&kept, LockKind::ReadWrite, "n", "k").unwrap();
        assert!(!gate.is_held());
        assert_eq!(gate.waiters, 2);
        assert!(read_kind(&Snapshot::default(), LockKind::Exclusive, "n", "k").is_none());
    }

    #[test]
    fn a_quorum_holder_holds_only_on_a_majority() {
        let on = |token: &str, ttl: u64| {
            let mut snapshot = Snapshot::default();
            snapshot.exclusive.value = Some(format!("{token}|q0123abcd"));
            snapshot.exclusive.pttl_ms = ttl as i64;
            read_kind(&snapshot, LockKind::Exclusive, "n", "k").unwrap()
        };
        let merged = merge(vec![on("aa", 900), on("bb", 500), on("aa", 700)], 3).unwrap();
        assert_eq!(merged.holders.len(), 2);
        let holding: Vec<&Holder> = merged.holding().collect();
        assert_eq!(holding.len(), 1);
        assert_eq!(holding[0].token, "aa");
        assert_eq!(holding[0].nodes, 2);
        assert_eq!(holding[0].ttl, Some(Duration::from_millis(700)));
        let minority = merge(vec![on("aa", 900)], 3).unwrap();
        assert!(!minority.is_held());
    }

    /// The holder's token was written back to two nodes; the third granted
    /// late and counted on from its own clock: the token shown is the
    /// holder's, not the late node's larger number.
    #[test]
    fn a_quorum_shows_the_fence_a_majority_reached() {
        let fenced = |fence: u64| {
            let mut snapshot = Snapshot::default();
            snapshot.exclusive.value = Some("aa|q0123abcd".to_owned());
            snapshot.exclusive.pttl_ms = 900;
            snapshot.exclusive.fence = Some(fence);
            read_kind(&snapshot, LockKind::Exclusive, "n", "k").unwrap()
        };
        let merged = merge(vec![fenced(10), fenced(17), fenced(10)], 3).unwrap();
        assert_eq!(merged.fencing_token, Some(10));
        let five = merge(
            vec![fenced(10), fenced(17), fenced(10), fenced(18), fenced(10)],
            5,
        )
        .unwrap();
        assert_eq!(five.fencing_token, Some(10));
        // Only one node keeps a fence: the one it keeps.
        assert_eq!(merge(vec![fenced(10)], 3).unwrap().fencing_token, Some(10));
        // One server: its value.
        assert_eq!(merge(vec![fenced(12)], 1).unwrap().fencing_token, Some(12));
    }
}
