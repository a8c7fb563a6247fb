//! Who holds what: a client's identity (instance, host, pid, start time,
//! version) and its holds (name, function, when taken), kept in Redis as the
//! client's *holder record*, a hash at `<prefix>client:{<client id>}`
//! (docs/design.md §1). Every token ends with its client's id, so lockctl
//! (`Client::lock_info`) goes from a lock's token to the record, and from
//! it to the process and the function behind the token.
//!
//! Nothing here is on an acquisition's way to Redis. An acquisition adds
//! its hold to an in-memory table (a short lock on one of its shards, no
//! allocation) and a release removes it; a writer task, one per client,
//! writes the table to Redis in the background:
//!
//! - only holds held for about [`RECORD_AFTER`] (1 s; those that reach it
//!   within the next [`SETTLE`] go with the write): a hold released sooner
//!   is never written, so locks taken and released at a high rate
//!   cost no Redis command at all;
//! - at most one write per [`SETTLE`] (200 ms) after a change (one
//!   `record.lua` call: the holds added and removed since the last one, the
//!   identity, the expiry), and a refresh every [`REFRESH`] (10 s) while
//!   the record holds anything; the record lives [`RECORD_TTL`] (60 s) past
//!   its last write, so a process that died leaves it for a minute at most;
//! - deleted as soon as the client holds nothing recorded any more (and
//!   when the client is dropped), so an idle client leaves no key behind.
//!
//! A failed write is repeated whole (the record deleted and rewritten)
//! after a pause; so is one that finds the record gone (`FLUSHALL`, an
//! eviction, a pause of the process past its ttl).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::{Backend, Kind, RecordWrite};
use crate::wall_clock::WallClock;

/// A hold is written to the record once it has been held this long.
pub(crate) const RECORD_AFTER: Duration = Duration::from_secs(1);
/// How long the writer lets changes gather before it writes them.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);
/// How often a record that holds anything is written again (its expiry
/// pushed back), changed or not.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);
/// How long a record lives after its last write.
pub(crate) const RECORD_TTL: Duration = Duration::from_secs(60);
/// The longest pause before a failed write is tried again.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(10);
/// Shards of the table of holds: acquisitions on many threads rarely meet
/// on one lock.
const SHARDS: usize = 16;

/// The record's fields: the client's identity...
pub(crate) const FIELD_CLIENT: &str = "client";
pub(crate) const FIELD_INSTANCE: &str = "instance";
pub(crate) const FIELD_HOST: &str = "host";
pub(crate) const FIELD_PID: &str = "pid";
pub(crate) const FIELD_STARTED: &str = "started_ms";
pub(crate) const FIELD_VERSION: &str = "version";
/// ... and one field per hold, `h:<the token's first 16 hex digits>`, whose
/// value is `<taken at, ms since the Unix epoch>|<kind>|<function>|<name>`
/// (the name last: it may hold `|`; `|` in a function label is written as
/// `/`).
pub(crate) const HOLD_FIELD_PREFIX: &str = "h:";

/// The record's key for the client `client_id`: the id is its hash tag.
pub(crate) fn record_key(key_prefix: &str, client_id: &str) -> String {
    format!("{key_prefix}client:{{{client_id}}}")
}

/// The field of the hold whose token is `token`.
pub(crate) fn hold_field(token: &str) -> String {
    let head = token.get(..16).unwrap_or(token);
    format!("{HOLD_FIELD_PREFIX}{head}")
}

/// Who a client is, as its record says.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// 16 hex digits, the end of every token of the client.
    pub(crate) client_id: String,
    pub(crate) instance: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    /// When the client was built, ms since the Unix epoch.
    pub(crate) started_ms: u64,
}

impl Identity {
    /// The identity of a client built now (by `clock`) in this process;
    /// `instance` defaults to `<host>:<pid>`. A `simulated` client (one on
    /// a simulated network) does not ask the system: its host is
    /// `simulated`, its process id 0, so that a simulation's history does
    /// not depend on the machine or the process it runs in.
    pub(crate) fn new(
        client_id: String,
        instance: Option<String>,
        clock: &WallClock,
        simulated: bool,
    ) -> Identity {
        let (host, pid) = if simulated {
            ("simulated".to_owned(), 0)
        } else {
            (host_name(), std::process::id())
        };
        Identity {
            instance: instance.unwrap_or_else(|| format!("{host}:{pid}")),
            client_id,
            host,
            pid,
            started_ms: unix_ms(clock.now()),
        }
    }

    fn fields(&self) -> [(String, String); 6] {
        [
            (FIELD_CLIENT.to_owned(), self.client_id.clone()),
            (FIELD_INSTANCE.to_owned(), self.instance.clone()),
            (FIELD_HOST.to_owned(), self.host.clone()),
            (FIELD_PID.to_owned(), self.pid.to_string()),
            (FIELD_STARTED.to_owned(), self.started_ms.to_string()),
            (
                FIELD_VERSION.to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            ),
        ]
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// This machine's host name (`gethostname`), or `unknown-host`.
fn host_name() -> String {
    #[cfg(unix)]
    {
        let mut buffer = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname writes at
        // most that many bytes.
        let status =
            unsafe { libc::gethostname(buffer.as_mut_ptr().cast::<libc::c_char>(), buffer.len()) };
        if status == 0 {
            let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
            if let Ok(name) = std::str::from_utf8(&buffer[..end]) {
                if !name.is_empty() {
                    return name.to_owned();
                }
            }
        }
    }
    #[cfg(not(unix))]
    if let Ok(name) = std::env::var("COMPUTERNAME") {
        if !name.is_empty() {
            return name;
        }
    }
    "unknown-host".to_owned()
}

/// What the holder record says of a hold (a `Hold`, which registers
/// itself; a trait, so that this table stays below the holds).
pub(crate) trait Recorded: Send + Sync {
    /// When it was taken (its acquire's send time).
    fn taken_at(&self) -> Instant;
    fn kind(&self) -> Kind;
    fn token(&self) -> &str;
    /// The lock's name, as given.
    fn name(&self) -> &str;
    /// What took it (`Lock::caller`, the attribute's function), if known.
    fn caller(&self) -> Option<&str>;
}

/// A hold in the table.
struct Live {
    hold: Weak<dyn Recorded>,
    /// When it was taken (its acquire's send time).
    taken: Instant,
    /// The writer chose to write it: its removal must reach the record.
    recorded: bool,
}

/// The table's hasher: its keys are ids this client numbered itself, so
/// there is nobody to defend against, and the standard SipHash (about 120
/// instructions each way, on every acquisition and release) buys nothing.
/// A multiply and a fold spread consecutive ids over every bit.
type IdHash = std::hash::BuildHasherDefault<IdHasher>;

#[derive(Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8 | u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        let mixed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 32);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the writer task and the client share: the writer is woken when
/// the table changes, and respawned if its runtime is gone.
#[derive(Default)]
struct Signals {
    /// The table changed since the writer last read it.
    dirty: AtomicBool,
    /// A writer task exists.
    running: AtomicBool,
    wake: Notify,
}

/// One client's holds and identity, and its writer.
pub(crate) struct Holders {
    backend: Arc<dyn Backend>,
    identity: Identity,
    key: String,
    shards: Vec<Mutex<HashMap<u64, Live, IdHash>>>,
    next_id: AtomicU64,
    signals: Arc<Signals>,
    /// The record may be in Redis: deleted when the client is dropped.
    written: AtomicBool,
    /// The wall clock the record's times are read on.
    clock: WallClock,
}

/// A hold's place in its client's table; dropped with the hold, which
/// takes it out.
pub(crate) struct Registered {
    holders: Arc<Holders>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let removed = self.holders.shard(self.id).remove(&self.id);
        if removed.is_some_and(|live| live.recorded) {
            self.holders.changed();
        }
    }
}

/// How a hold was taken: its metric label and function, and its place in
/// the holder record.
pub(crate) struct Site {
    pub(crate) label: Cow<'static, str>,
    pub(crate) caller: Option<Cow<'static, str>>,
    pub(crate) _registered: Registered,
}

impl Holders {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        identity: Identity,
        key_prefix: &str,
        clock: WallClock,
    ) -> Arc<Holders> {
        Arc::new(Holders {
            backend,
            key: record_key(key_prefix, &identity.client_id),
            identity,
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            next_id: AtomicU64::new(0),
            signals: Arc::default(),
            written: AtomicBool::new(false),
            clock,
        })
    }

    pub(crate) fn identity(&self) -> &Identity {
        &self.identity
    }

    fn shard(&self, id: u64) -> MutexGuard<'_, HashMap<u64, Live, IdHash>> {
        self.shards[(id % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds `hold` to the table (the record gets it once it has been held
    /// for [`RECORD_AFTER`]); it leaves when the returned handle is dropped.
    pub(crate) fn register<H: Recorded + 'static>(self: &Arc<Self>, hold: &Arc<H>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let weak: Weak<dyn Recorded> = Arc::downgrade(hold) as Weak<dyn Recorded>;
        self.shard(id).insert(
            id,
            Live {
                hold: weak,
                taken: hold.taken_at(),
                recorded: false,
            },
        );
        self.changed();
        Registered {
            holders: Arc::clone(self),
            id,
        }
    }

    /// The table changed: wakes the writer (starting it if needed), unless
    /// it was told already and has not read the table since.
    fn changed(self: &Arc<Self>) {
        let signals = &self.signals;
        if signals.dirty.load(Ordering::Relaxed) || signals.dirty.swap(true, Ordering::AcqRel) {
            return;
        }
        if !signals.running.swap(true, Ordering::AcqRel) {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                signals.running.store(false, Ordering::Release);
                signals.dirty.store(false, Ordering::Release);
                return;
            };
            let alive = Alive(Arc::clone(signals));
            runtime.spawn(write(Arc::downgrade(self), alive));
        }
        signals.wake.notify_one();
    }

    /// Reads the table: the holds to write (all recorded ones when `all`),
    /// the recorded holds still held, and when the next hold turns old
    /// enough to be written. A hold that turns old enough within
    /// [`SETTLE`] is written now: holds taken one after another go in one
    /// write, not one write each.
    fn read_table(&self, now: Instant, all: bool) -> Reading {
        let mut reading = Reading::default();
        for shard in &self.shards {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (&id, live) in shard.iter_mut() {
                if !live.recorded && now + SETTLE < live.taken + RECORD_AFTER {
                    let due = live.taken + RECORD_AFTER - SETTLE;
                    reading.next_due = Some(reading.next_due.map_or(due, |at| at.min(due)));
                    continue;
                }
                if live.recorded && !all {
                    reading.present.insert(id);
                    continue;
                }
                // Upgraded here, dropped after the shard is unlocked (the
                // last reference's drop takes the hold out of this shard).
                if let Some(hold) = live.hold.upgrade() {
                    live.recorded = true;
                    reading.present.insert(id);
                    reading.to_write.push((id, hold));
                }
            }
        }
        reading
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        self.signals.wake.notify_one(); // the writer ends
        if !self.written.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the record expires
        };
        let (backend, key) = (Arc::clone(&self.backend), self.key.clone());
        runtime.spawn(async move {
            let delete = RecordWrite {
                key: &key,
                ttl_ms: 0,
                replace: true,
                set: &[],
                delete: &[],
            };
            let _ = backend.write_record(&delete).await;
        });
    }
}

/// Marks the writer gone when its task ends or is dropped with its runtime,
/// so that the next change starts another.
struct Alive(Arc<Signals>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.dirty.store(false, Ordering::Release);
        self.0.running.store(false, Ordering::Release);
    }
}

/// One reading of the table.
#[derive(Default)]
struct Reading {
    to_write: Vec<(u64, Arc<dyn Recorded>)>,
    present: HashSet<u64>,
    next_due: Option<Instant>,
}

/// What the writer knows of the record in Redis.
struct Writer {
    /// The holds the record has, by table id, with their fields.
    /// Ordered: the fields removed are sent in its order.
    in_redis: BTreeMap<u64, String>,
    /// The record is to be rewritten whole (a write failed, or found it
    /// gone).
    whole: bool,
    last_write: Option<Instant>,
    /// After failures: when to try again, and the pause after that.
    retry: Option<(Instant, Duration)>,
    /// Writes have been failing (logged once).
    failing: bool,
}

/// The writer task: writes what changed, refreshes, sleeps until the next
/// change or planned time; ends with its client.
async fn write(holders: Weak<Holders>, alive: Alive) {
    let signals = Arc::clone(&alive.0);
    let mut writer = Writer {
        in_redis: BTreeMap::new(),
        whole: false,
        last_write: None,
        retry: None,
        failing: false,
    };
    let mut next: Option<Instant> = None;
    loop {
        let changed = match next {
            // Biased (deterministic under a simulation): a change first.
            Some(at) => tokio::select! {
                biased;
                _ = signals.wake.notified() => true,
                _ = tokio::time::sleep_until(at) => false,
            },
            None => {
                signals.wake.notified().await;
                true
            }
        };
        if changed {
            // Let changes gather: at most one write per SETTLE.
            tokio::time::sleep(SETTLE).await;
        }
        let Some(this) = holders.upgrade() else {
            return;
        };
        next = this.flush(&mut writer).await;
    }
}

impl Holders {
    /// Writes what changed in the table since the last write (or the whole
    /// record, or deletes it); returns when to look again without a change.
    async fn flush(&self, writer: &mut Writer) -> Option<Instant> {
        self.signals.dirty.store(false, Ordering::Release);
        let now = Instant::now();
        if writer.retry.is_some_and(|(at, _)| now < at) {
            return writer.retry.map(|(at, _)| at);
        }
        let whole = writer.whole;
        let mut reading = self.read_table(now, whole);
        // At most one write per SETTLE.
        reading.next_due = reading.next_due.map(|at| at.max(now + SETTLE));
        let removed: Vec<u64> = writer
            .in_redis
            .keys()
            .filter(|id| !reading.present.contains(id))
            .copied()
            .collect();
        let added: Vec<(u64, String, String)> = reading
            .to_write
            .iter()
            .filter(|(id, _)| whole || !writer.in_redis.contains_key(id))
            .map(|(id, hold)| {
                let (field, value) = hold_entry(hold.as_ref(), now, self.clock.now());
                (*id, field, value)
            })
            .collect();
        drop(reading.to_write); // outside any shard lock
        let refresh = writer.last_write.is_none_or(|at| now >= at + REFRESH);
        let result = if reading.present.is_empty() {
            if writer.in_redis.is_empty() && !whole {
                return reading.next_due; // nothing recorded, nothing to record
            }
            // Holds nothing recorded any more: no record.
            self.send(true, Vec::new(), Vec::new()).await
        } else if !added.is_empty() || !removed.is_empty() || refresh || whole {
            let mut set: Vec<(String, String)> = self.identity.fields().into();
            set.extend(
                added
                    .iter()
                    .map(|(_, field, value)| (field.clone(), value.clone())),
            );
            let delete = if whole {
                Vec::new()
            } else {
                removed
                    .iter()
                    .filter_map(|id| writer.in_redis.get(id).cloned())
                    .collect()
            };
            self.send(whole, set, delete).await
        } else {
            return earliest(reading.next_due, writer.next_refresh());
        };
        match result {
            Ok(existed) => {
                if !existed && !whole && !writer.in_redis.is_empty() && !reading.present.is_empty()
                {
                    // The record was gone (FLUSHALL, eviction, a long pause):
                    // what was just written is a part of it. Whole, at once.
                    tracing::debug!(record = %self.key, "holder record found gone; rewritten");
                    writer.whole = true;
                    return Some(Instant::now());
                }
                for id in &removed {
                    writer.in_redis.remove(id);
                }
                if whole {
                    writer.in_redis.clear();
                }
                for (id, field, _) in added {
                    writer.in_redis.insert(id, field);
                }
                writer.whole = false;
                writer.retry = None;
                writer.last_write = Some(Instant::now());
                self.written
                    .store(!writer.in_redis.is_empty(), Ordering::Release);
                if writer.failing {
                    writer.failing = false;
                    tracing::info!(record = %self.key, "holder record written again");
                }
                earliest(reading.next_due, writer.next_refresh())
            }
            Err(error) => {
                writer.whole = true;
                self.written.store(true, Ordering::Release);
                let pause = writer
                    .retry
                    .map_or(Duration::from_secs(1), |(_, pause)| pause);
                let at = Instant::now() + pause;
                writer.retry = Some((at, (pause * 2).min(MAX_RETRY_PAUSE)));
                if !writer.failing {
                    writer.failing = true;
                    tracing::warn!(
                        record = %self.key, %error,
                        "holder record not written (retried in the background): lockctl cannot \
                         name this process as the holder of its locks until it is"
                    );
                } else {
                    tracing::debug!(record = %self.key, %error, "holder record not written");
                }
                Some(at)
            }
        }
    }

    async fn send(
        &self,
        replace: bool,
        set: Vec<(String, String)>,
        delete: Vec<String>,
    ) -> Result<bool, crate::error::LockError> {
        let write = RecordWrite {
            key: &self.key,
            ttl_ms: RECORD_TTL.as_millis() as u64,
            replace,
            set: &set,
            delete: &delete,
        };
        self.backend.write_record(&write).await
    }
}

impl Writer {
    /// When the record is due for a refresh, if it holds anything.
    fn next_refresh(&self) -> Option<Instant> {
        if self.in_redis.is_empty() {
            return None;
        }
        self.last_write.map(|at| at + REFRESH)
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A hold's field and value in the record (see [`HOLD_FIELD_PREFIX`]).
/// `wall_now`: the wall clock's reading at `now`.
fn hold_entry(hold: &dyn Recorded, now: Instant, wall_now: SystemTime) -> (String, String) {
    let taken = wall_now
        .checked_sub(now.saturating_duration_since(hold.taken_at()))
        .unwrap_or(UNIX_EPOCH);
    let kind: Cow<'static, str> = match hold.kind() {
        Kind::Exclusive => "lock".into(),
        Kind::Read => "read".into(),
        Kind::Write => "write".into(),
        Kind::Semaphore { permits, .. } => format!("permits:{permits}").into(),
    };
    let caller = hold.caller().unwrap_or_default().replace('|', "/");
    (
        hold_field(hold.token()),
        format!("{}|{kind}|{caller}|{}", unix_ms(taken), hold.name()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_and_fields() {
        assert_eq!(
            record_key("lock:", "0123456789abcdef"),
            "lock:client:{0123456789abcdef}"
        );
        assert_eq!(
            hold_field("aaaaaaaaaaaaaaaa0123456789abcdef|q12"),
            "h:aaaaaaaaaaaaaaaa"
        );
        let clock = WallClock::default();
        let identity = Identity::new("0123456789abcdef".to_owned(), None, &clock, false);
        assert_eq!(
            identity.instance,
            format!("{}:{}", identity.host, std::process::id())
        );
        assert!(!identity.host.is_empty());
        let named = Identity::new(
            "0123456789abcdef".to_owned(),
            Some("web-1".to_owned()),
            &clock,
            false,
        );
        assert_eq!(named.instance, "web-1");
        let simulated = Identity::new("0123456789abcdef".to_owned(), None, &clock, true);
        assert_eq!(
            (simulated.instance.as_str(), simulated.pid),
            ("simulated:0", 0)
        );
    }
}
