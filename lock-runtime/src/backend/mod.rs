//! The backend: every Redis call a lock makes, and the decoding of its
//! replies into typed outcomes. The lease machinery above it (acquire,
//! wait, renewal, release, in-process hand-off) speaks only these types;
//! a deployment is an implementation of [`Backend`] ([`RedisBackend`]: one
//! Redis server, or a primary with replicas behind one address).
//!
//! Every call is one round trip (a command or a script run by EVALSHA) and
//! is safe to repeat: implementations retry failed connections within the
//! call's deadline, and report a call that got no answer as an error (its
//! outcome unknown).

mod ack_pool;
mod connection;
mod notify;
mod quorum;
mod redis_backend;
mod script_errors;
mod scripts;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::error::LockError;
use crate::keys::LockKeys;

pub(crate) use crate::error::{is_refusal, retryable};
pub(crate) use crate::transport::sentinel::Sentinels;
pub(crate) use crate::transport::switches::{Switch, Switches};
pub(crate) use connection::{Ack, Target};
pub(crate) use notify::{wait_for, Listen, Notifier, Subscription};
pub(crate) use quorum::QuorumBackend;
pub(crate) use redis_backend::RedisBackend;

/// Which primitive a lock is: its keys, its scripts, what its holders share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One holder at a time.
    Exclusive,
    /// A read share of a read/write lock: many readers, no writer.
    Read,
    /// The write side of a read/write lock: one writer, no reader.
    Write,
    /// `permits` of a semaphore's `capacity`: at most `capacity` permits
    /// held at once. `fair`: its releases wake waiters in queue order only
    /// (else every waiter that fits).
    Semaphore {
        capacity: u32,
        permits: u32,
        fair: bool,
    },
}

impl Kind {
    /// What follows the hash tag in the kind's Redis keys: an exclusive lock
    /// `order:42` lives at `lock:{order:42}`, its read/write lock at
    /// `lock:{order:42}:rw` and its semaphore at `lock:{order:42}:sem`:
    /// separate keys, so one name used as two kinds is two locks.
    pub(crate) fn key_suffix(self) -> &'static str {
        match self {
            Kind::Exclusive => "",
            Kind::Read | Kind::Write => ":rw",
            Kind::Semaphore { .. } => ":sem",
        }
    }

    /// The waiter's entry in the kind's queue: `<channel>|<token>` for the
    /// exclusive lock, `<r|w>|<channel>|<token>` for a read/write lock,
    /// `<permits>|<channel>|<token>` for a semaphore.
    pub(crate) fn queue_entry(self, channel: &str, token: &str) -> String {
        match self {
            Kind::Exclusive => format!("{channel}|{token}"),
            Kind::Read => format!("r|{channel}|{token}"),
            Kind::Write => format!("w|{channel}|{token}"),
            Kind::Semaphore { permits, .. } => format!("{permits}|{channel}|{token}"),
        }
    }
}

/// Whom queued ahead of it an attempt leaves a free lock to (the scripts'
/// `respect` argument: 0, 1, 2). A set's waiter (its entry ends in `*`,
/// `lease/multi.rs`) keeps no key from a `fair` locker, or a holder of one of
/// its keys waiting for another would wait for it forever (design §16); the
/// releaser's own next attempt lets every waiter go first (§4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Respect {
    /// Nobody: a free lock is taken (default mode).
    No = 0,
    /// The first live waiter that is not a set's (`fair`).
    Singles = 1,
    /// The first live waiter of any kind: right after this client handed
    /// the lock over, until its first wait (self-barging, design §4).
    Everyone = 2,
}

impl Respect {
    /// The scripts' argument.
    pub(crate) fn arg(self) -> u8 {
        self as u8
    }

    /// Whether it lets anyone go first.
    pub(crate) fn any(self) -> bool {
        self != Respect::No
    }
}

/// One attempt to take a lock.
#[derive(Clone, Copy)]
pub(crate) struct AcquireRequest<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a LockKeys,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    /// With a fencing token, kept this long after the acquisition.
    pub(crate) fence_retention_ms: Option<u64>,
    /// The caller's entry in the queue of waiters ([`Kind::queue_entry`]).
    pub(crate) member: &'a str,
    /// Join (or refresh a place in) the queue when the lock is busy.
    pub(crate) join: bool,
    /// Whom queued ahead of the caller a free lock is left to.
    pub(crate) respect: Respect,
    /// The lock is `fair`: `respect` on every attempt (else only right after
    /// this client handed the lock to a waiter).
    pub(crate) fair: bool,
    /// When the caller's wait ends (`None`: a try). Over a quorum no node is
    /// waited for past it: a waiter must not overrun its `wait`.
    pub(crate) deadline: Option<Instant>,
    /// An earlier attempt with this token got no answer: if the lock holds
    /// the token, that attempt took it.
    pub(crate) mine: bool,
    /// How long a queued waiter keeps its place without refreshing it.
    pub(crate) waiter_timeout_ms: u64,
    /// What the backend keeps across this waiter's attempts (`None`: a try,
    /// or the first attempt of a waiting acquire, before it waits).
    pub(crate) place: Option<&'a WaitPlace>,
    /// When the attempt's calls must have ended, where it makes several
    /// or waits before them (`None`: each call has its own deadline): an
    /// attempt ends within one call deadline of its start (design §3).
    pub(crate) until: Option<Instant>,
}

/// What a backend keeps across one waiter's attempts: over a quorum, the
/// waiter's ticket (its place in line, sent unchanged to every node so that
/// every node orders its waiters alike) and what its last attempt showed.
/// Unused on one server or a cluster, whose one queue per lock orders its
/// waiters by itself.
#[derive(Debug, Default)]
pub(crate) struct WaitPlace {
    /// The waiter's ticket; 0 until an attempt put it in line.
    pub(crate) ticket: AtomicU64,
    /// Its last attempt found it first in line on a majority of the nodes.
    pub(crate) first: AtomicBool,
    /// Its attempts in a row that found nobody holding the lock and still
    /// got no majority (split votes).
    pub(crate) split_votes: AtomicU32,
    /// Its attempts so far: over a quorum each writes its number into its
    /// value, and a node lets a later attempt of the same waiter replace an
    /// earlier one's grant (given up, its give-back on its way), never the
    /// reverse.
    pub(crate) attempts: AtomicU32,
    /// Its attempts in a row that failed (too few nodes answered, or a
    /// majority granted too late).
    pub(crate) failures: AtomicU32,
    /// It failed several attempts in a row and left the line, so that a
    /// waiter that cannot complete an attempt does not stand first and hold
    /// everyone back; it stays out until an attempt is answered by a
    /// majority.
    pub(crate) out_of_line: AtomicBool,
    /// A semaphore over a quorum: the slots its next attempt asks for,
    /// chosen from what the nodes reported taken (empty: any), and whether
    /// they looked free on a majority of the nodes that answered.
    pub(crate) slots: std::sync::Mutex<(Vec<u32>, bool)>,
}

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Taken, with a fencing token when one was asked for; `found`: the
    /// lock already held this token (an earlier attempt took it), with this
    /// remaining ttl.
    Acquired {
        fence: Option<u64>,
        found: Option<Duration>,
        /// The value the lock holds when it is not the caller's token: over
        /// a quorum, the winning attempt's `<token>|q<n>`, which renewals
        /// extend exactly (an earlier attempt's value left on a node is not
        /// counted as held).
        holds: Option<String>,
    },
    /// Held by another, whose key expires after `expires_in` when known
    /// (none: free, but another waiter is first in line; for the shared
    /// kinds, also: blocked by a queued writer or by waiters ahead).
    Busy { expires_in: Option<Duration> },
}

/// One attempt to take every exclusive lock of a set at once, or none
/// (`lua/acquire_all.lua`): the set's keys share a node and a slot
/// ([`Backend::takes_together`]). One token for the whole set.
#[derive(Clone, Copy)]
pub(crate) struct AcquireAllRequest<'a> {
    /// The set's locks, in its (canonical) order.
    pub(crate) keys: &'a [LockKeys],
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    pub(crate) fence_retention_ms: Option<u64>,
    /// The caller's entry, the same in every queue of the set.
    pub(crate) member: &'a str,
    /// Join (or refresh a place in) every queue of the set when not taken.
    pub(crate) join: bool,
    /// Whom queued ahead of the caller a free lock is left to.
    pub(crate) respect: Respect,
    /// An earlier attempt with this token got no answer.
    pub(crate) mine: bool,
    pub(crate) waiter_timeout_ms: u64,
}

/// What an attempt on a whole set found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireAll {
    /// Every lock taken (`found`: by an earlier attempt whose answer was
    /// lost; the smallest remaining ttl), with one fencing token when asked.
    Acquired {
        fence: Option<u64>,
        found: Option<Duration>,
    },
    /// None taken: the lock at `index` of the set is held (expiring after
    /// `expires_in` when known), or free with another waiter first.
    Busy {
        index: usize,
        expires_in: Option<Duration>,
    },
}

/// What a release (or a hand-off, or a renewal) found in the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The caller's token: done.
    Mine,
    /// Nothing: the key had expired.
    Gone,
    /// Another holder's token (left untouched).
    Other,
}

/// A release's outcome, with what the caller needs to judge a retried one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Release {
    pub(crate) found: Found,
    /// The release woke a waiter of another client.
    pub(crate) woke: bool,
    /// The answer came to a retry: an earlier attempt may have run.
    pub(crate) retried: bool,
    /// When the answered attempt was sent.
    pub(crate) sent_at: Instant,
}

/// A hand-off's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// The key holds the next token now; `queued`: waiters of other clients
    /// are queued.
    Passed { fence: Option<u64>, queued: bool },
    /// The key no longer held the passer's token.
    Refused(Found),
}

/// One lock in a renewal batch.
pub(crate) struct RenewItem<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a LockKeys,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
}

/// One write of a client's holder record (`lua/record.lua`, written in the
/// background by `lease/holders.rs`).
pub(crate) struct RecordWrite<'a> {
    /// `<prefix>client:{<client id>}`.
    pub(crate) key: &'a str,
    pub(crate) ttl_ms: u64,
    /// Delete the record first: it is rewritten whole.
    pub(crate) replace: bool,
    /// Field, value pairs to set; none: the record is deleted.
    pub(crate) set: &'a [(String, String)],
    /// Fields to delete.
    pub(crate) delete: &'a [String],
}

/// One node's reading of the three locks of a name (`lua/inspect.lua`):
/// the admin API's raw material (`crate::admin` builds its public view).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Snapshot {
    /// The server's clock, in ms: share and permit expiries are on it.
    pub(crate) now_ms: i64,
    pub(crate) exclusive: ExclusiveState,
    pub(crate) rw: RwState,
    pub(crate) semaphore: SemaphoreState,
}

/// The exclusive lock's keys, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExclusiveState {
    /// The lock key's value: the holder's token (maybe with a wake mark,
    /// or a quorum attempt's `|q<mark>`), or `kept:<token>`.
    pub(crate) value: Option<String>,
    /// The lock key's `PTTL` (-2: no key, -1: no expiry).
    pub(crate) pttl_ms: i64,
    /// The last fencing token handed out, while the fence key lives.
    pub(crate) fence: Option<u64>,
    /// Queued waiters whose place has not expired.
    pub(crate) waiters: u64,
}

/// A read/write lock's keys, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RwState {
    /// The writer key: a writer's token, `kept:<token>`, a lone reader's
    /// `r:<token>` or the gate `q`.
    pub(crate) writer: Option<String>,
    pub(crate) pttl_ms: i64,
    /// Reader shares: token, expiry (server ms).
    pub(crate) readers: Vec<(String, f64)>,
    pub(crate) fence: Option<u64>,
    pub(crate) waiters: u64,
}

/// A semaphore's keys, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SemaphoreState {
    pub(crate) pttl_ms: i64,
    /// Holders `<k>|<token>` with their expiry, and `#capacity:<N>` (inf).
    pub(crate) members: Vec<(String, f64)>,
    pub(crate) waiters: u64,
}

/// An exclusive lock's key as one node has it (`lua/peek.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peeked {
    /// The holder's token (maybe with a wake mark or a quorum attempt's
    /// mark), or `kept:<token>`; `None`: no key.
    pub(crate) value: Option<String>,
    /// The key's `PTTL` (-2: no key).
    pub(crate) pttl_ms: i64,
}

/// A deployment of the lock: where its keys live and how they are read and
/// written. Every method is one round trip, retried on connection faults
/// within the deadline.
pub(crate) trait Backend: Send + Sync + 'static {
    /// One acquire attempt.
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, LockError>>;

    /// Compare-and-delete (`keep_ms` > 0: compare-and-keep for that long),
    /// waking the waiter the lock's wake mark names.
    /// For the shared kinds: ends the caller's share and wakes the waiters
    /// that may enter now.
    fn release<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        token: &'a str,
        keep_ms: u64,
    ) -> BoxFuture<'a, Result<Release, LockError>>;

    /// Gives back a key a set's waiter took in a round that did not get the
    /// whole set (`token`: the value it took it with): compare-and-delete,
    /// waking the first waiter in line unless that is `own`, the set's own
    /// place (it keeps no key, and must not wake itself round after round).
    /// On one server or a cluster the value a set's waiter first in line
    /// takes carries no wake mark, so the release wakes nobody then.
    fn give_back<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        own: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        let _ = own;
        Box::pin(async move {
            self.release(Kind::Exclusive, keys, token, 0).await?;
            Ok(())
        })
    }

    /// A waiter gives up its place in the queue.
    fn leave<'a>(
        &'a self,
        kind: Kind,
        keys: &'a LockKeys,
        member: &'a str,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Passes the lock from `token` to `next` (its ttl, a fencing token
    /// when `fence_retention_ms` is set).
    fn pass<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: &'a str,
        next: &'a str,
        ttl_ms: u64,
        fence_retention_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Pass, LockError>>;

    /// Whether every lock of `keys` can be taken by one script
    /// ([`acquire_all`](Backend::acquire_all)): they live on one node, in
    /// one slot of a cluster, and an acquisition needs no confirmation
    /// beyond its own reply (not in acknowledged mode, not over a quorum).
    fn takes_together(&self, keys: &[LockKeys]) -> bool {
        let _ = keys;
        false
    }

    /// One attempt to take every lock of a set, or none, in one round trip
    /// (only for keys that [`takes_together`](Backend::takes_together)).
    fn acquire_all<'a>(
        &'a self,
        request: AcquireAllRequest<'a>,
    ) -> BoxFuture<'a, Result<AcquireAll, LockError>> {
        Box::pin(async move {
            let name = request.keys.first().map_or("", LockKeys::name);
            Err(LockError::redis(
                name,
                "acquire",
                redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "this deployment cannot take several keys in one script",
                )),
            ))
        })
    }

    /// Makes the lock's last fencing token at least `token` (kept for
    /// `retention_ms`), so that every later token of the key is larger: a
    /// set's fencing token, taken across slots or nodes, is the largest of
    /// its keys' and raised on all of them.
    fn fence_at_least<'a>(
        &'a self,
        keys: &'a LockKeys,
        token: u64,
        retention_ms: u64,
    ) -> BoxFuture<'a, Result<(), LockError>>;

    /// Extends every lock of `items` that still holds its token: one round
    /// trip for the whole batch. `round_trips` counts the round trips made.
    /// Per lock: what was found, or `None` if it could not be decided (over
    /// a quorum, too few nodes answered): that lock alone is tried again.
    fn renew<'a>(
        &'a self,
        items: &'a [RenewItem<'a>],
        round_trips: &'a AtomicU64,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Option<Found>>>>;

    /// `items` cut into the parts renewed by one round trip each (on a
    /// cluster, one part per primary); empty or one part: all together.
    fn partition<'a>(&'a self, items: &'a [RenewItem<'a>]) -> BoxFuture<'a, Vec<Vec<usize>>> {
        let _ = items;
        Box::pin(async { Vec::new() })
    }

    /// The longest one call may take, its retries included.
    fn call_deadline(&self) -> Duration;

    /// Admin: every key matching the `SCAN` pattern `pattern` (`count` per
    /// step), per node: one list for one server or a whole cluster (every
    /// primary scanned), one per node of a quorum.
    fn scan<'a>(
        &'a self,
        pattern: &'a str,
        count: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<String>>, LockError>>;

    /// Admin: the three locks of `name` as each node has them (`keys`: the
    /// nine keys of `lua/inspect.lua`); one snapshot for one server or a
    /// cluster, one per node of a quorum. Reads only.
    fn inspect<'a>(
        &'a self,
        name: &'a str,
        keys: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Snapshot>, LockError>>;

    /// `Lock::holder`: the exclusive lock's key as each node has it: one
    /// reading for one server or a cluster, one per node of a quorum
    /// (`None` for a node that did not answer). Reads only, with commands
    /// of the lock's own ACL rule (`get`, `pttl`).
    fn peek<'a>(
        &'a self,
        keys: &'a LockKeys,
    ) -> BoxFuture<'a, Result<Vec<Option<Peeked>>, LockError>>;

    /// Writes (or deletes) a client's holder record: on the server, on the
    /// primary of the record's slot in a cluster, on every node of a quorum.
    /// Returns whether the record existed before, on every node; fails if
    /// any node did not take the write.
    fn write_record<'a>(
        &'a self,
        write: &'a RecordWrite<'a>,
    ) -> BoxFuture<'a, Result<bool, LockError>>;

    /// Admin: a client's holder record, as field, value pairs (none when
    /// there is no record). Over a quorum, the records of the nodes that
    /// answered, merged (the first node's value of a field wins); an error
    /// only when no node answered.
    fn read_record<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, LockError>>;

    /// Whether a lock may be passed between tasks of a process (`pass`,
    /// in-process cohorts). Not in acknowledged mode (each holder's
    /// acquisition is confirmed by replicas). Over a quorum a pass is
    /// settled by a majority, as an acquisition is.
    fn passes_in_process(&self) -> bool {
        true
    }

    /// Whether a pass may carry a new fencing token (`pass` with a
    /// retention). Not over a quorum: its token is written back to a
    /// majority (a second round trip), so fenced waiters there wait in
    /// Redis, outside the cohort.
    fn passes_fenced_in_process(&self) -> bool {
        self.passes_in_process()
    }

    /// The switches of primary this backend's connections learn of (a
    /// Sentinel failover, a Redis Cluster primary failed over), after
    /// which releases and renewals sent to the old primary are made good on
    /// the new one (`lease/replay.rs`). `None` where no other primary can
    /// take over (one server, a quorum of independent masters).
    fn switches(&self) -> Option<Arc<Switches>> {
        None
    }

    /// This backend as a [`RedisBackend`], if it is one: the hot path
    /// (acquire, release) calls it directly, without the box each call
    /// through the trait costs (an allocation per call, of a future too
    /// large for the allocator's per-thread cache when many locks are in
    /// flight: docs/benchmarks.md, "Client CPU").
    fn as_redis(&self) -> Option<&RedisBackend> {
        None
    }
}
