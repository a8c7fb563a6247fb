//! A quorum's nodes: each one's connection, the name it is reported by, and
//! whether it answered its last call (a node that did not is not waited for
//! when only it could still decide an attempt).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{retryable, RedisBackend};
use crate::error::LockError;

pub(super) struct Node {
    pub(super) redis: RedisBackend,
    /// `host:port` (never a password), for errors and logs.
    pub(super) label: String,
    /// What its last call showed: [`UNKNOWN`] (none yet), [`UP`] (an
    /// answer) or [`DOWN`] (no answer in time, or the connection failed).
    health: AtomicU8,
    /// When its failure was last logged (ms since `Nodes::started`).
    warned: AtomicU64,
    /// Its clock (µs) as its last answer gave it, and when that answer
    /// arrived: its clock now, give or take a round trip.
    clock: Mutex<Option<(Instant, u64)>>,
    /// Until when (ms since `started`) its calls fail at once as refused,
    /// without dialing it: it refused a connection less than
    /// [`REFUSED_FOR`] ago.
    refused_until: AtomicU64,
    started: Instant,
}

/// How long a node that refused a connection is not dialed again: its
/// calls fail at once, as refused, until then, and the first call after
/// it dials again (a node restarted is back within that long). Each call
/// to a killed node dialed twice (one retry, for a reconnect made while it
/// was down), with a pause between, on every attempt: with 2 of 5 nodes
/// killed, 0.71 × the sections per second of all up (issue 40).
const REFUSED_FOR: Duration = Duration::from_millis(50);

pub(super) struct Nodes {
    list: Vec<Node>,
    started: Instant,
}

/// The least time between two warnings about one node.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Why a node did not answer, in an error or a log line.
pub(super) enum Silence {
    /// No answer within the per-node timeout.
    NoAnswer(Duration),
    /// The call failed (the connection, or an error reply).
    Failed(LockError),
}

impl Silence {
    /// Whether the node refused the connection (it is not running).
    pub(super) fn is_refusal(&self) -> bool {
        matches!(self, Silence::Failed(LockError::Redis { source, .. }) if source.is_connection_refusal())
    }
}

impl std::fmt::Display for Silence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Silence::NoAnswer(timeout) => {
                write!(f, "no answer within {}", crate::error::Readable(*timeout))
            }
            Silence::Failed(LockError::Redis { source, .. }) => write!(f, "{source}"),
            Silence::Failed(other) => write!(f, "{other}"),
        }
    }
}

impl Nodes {
    pub(super) fn new(nodes: Vec<(RedisBackend, String)>) -> Nodes {
        let started = Instant::now();
        Nodes {
            list: nodes
                .into_iter()
                .map(|(redis, label)| Node {
                    redis,
                    label,
                    health: AtomicU8::new(UNKNOWN),
                    warned: AtomicU64::new(0),
                    clock: Mutex::new(None),
                    refused_until: AtomicU64::new(0),
                    started,
                })
                .collect(),
            started,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// N/2 + 1.
    pub(super) fn quorum(&self) -> usize {
        self.list.len() / 2 + 1
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Node> {
        self.list.iter()
    }

    /// A node failed a call that the quorum carried anyway: not returned,
    /// so logged (at most every [`WARN_EVERY`] per node), since the quorum
    /// now tolerates one failure less.
    pub(super) fn failed(&self, node: usize, what: &str) {
        let node_ref = &self.list[node];
        let now = self.started.elapsed().as_millis() as u64 + WARN_EVERY.as_millis() as u64;
        let last = node_ref.warned.load(Ordering::Relaxed);
        if now >= last + WARN_EVERY.as_millis() as u64
            && node_ref
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(node, address = %node_ref.label, "a quorum node failed a {what} the others carried; the quorum tolerates one failure less until it is back");
        }
    }
}

impl std::ops::Index<usize> for Nodes {
    type Output = Node;

    fn index(&self, index: usize) -> &Node {
        &self.list[index]
    }
}

/// [`Node::health`]'s states.
const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

impl Node {
    /// It answered its last call: an attempt that only it could still
    /// decide waits for it (its full timeout).
    pub(super) fn is_up(&self) -> bool {
        self.health.load(Ordering::Relaxed) == UP
    }

    /// This client has not heard from it yet.
    pub(super) fn is_unknown(&self) -> bool {
        self.health.load(Ordering::Relaxed) == UNKNOWN
    }

    /// It failed its last call.
    pub(super) fn is_down(&self) -> bool {
        self.health.load(Ordering::Relaxed) == DOWN
    }

    /// Notes the node's clock (µs) from an answer that just arrived.
    pub(super) fn read_clock(&self, clock_us: u64) {
        if clock_us > 0 {
            *self
                .clock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                Some((Instant::now(), clock_us));
        }
    }

    /// The node's clock (µs) at `at`, as its last answer gave it; 0 before
    /// any answer.
    pub(super) fn clock_at(&self, at: Instant) -> u64 {
        let reading = *self
            .clock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reading.map_or(0, |(read_at, clock_us)| {
            let since = at.saturating_duration_since(read_at).as_micros() as u64;
            let before = read_at.saturating_duration_since(at).as_micros() as u64;
            (clock_us + since).saturating_sub(before)
        })
    }

    /// The error a call fails with at once while the node refused a
    /// connection less than [`REFUSED_FOR`] ago (none: dial it).
    pub(super) fn refusing(&self, name: &str, operation: &'static str) -> Option<LockError> {
        let now = self.started.elapsed().as_millis() as u64;
        (now < self.refused_until.load(Ordering::Relaxed)).then(|| {
            LockError::redis_at(
                name,
                operation,
                &self.label,
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "connection refused moments ago; not dialed again yet",
                )),
            )
        })
    }

    /// Notes a call's outcome: a refused connection is not dialed again
    /// for [`REFUSED_FOR`].
    pub(super) fn after<T>(&self, result: &Result<T, LockError>) {
        if matches!(result, Err(LockError::Redis { source, .. }) if source.is_connection_refusal())
        {
            let until = self.started.elapsed() + REFUSED_FOR;
            self.refused_until
                .store(until.as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// Notes what its last call showed: `Some(true)` an answer, `Some(false)`
    /// no answer or a failed connection, `None` nothing (cut off early).
    pub(super) fn saw(&self, answered: Option<bool>) {
        if let Some(answered) = answered {
            let health = if answered { UP } else { DOWN };
            self.health.store(health, Ordering::Relaxed);
        }
    }
}

/// Whether a call's result shows the node answering: any reply (even an
/// error reply such as a missing permission), but not a failed connection.
pub(super) fn answered<T>(result: &Result<T, LockError>) -> bool {
    match result {
        Ok(_) => true,
        Err(LockError::Redis { source, .. }) => !(retryable(source) || source.is_timeout()),
        Err(_) => true,
    }
}
