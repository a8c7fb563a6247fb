//! What a run did, as the checkers read it: every call (its start, end,
//! options and outcome), every hold with the validity the library itself
//! gave it, fencing tokens, faults; and its text, which two runs of one seed
//! must print alike.

use std::fmt::Write as _;

use crate::world::Micros;

/// How a key is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Read,
    Write,
    /// Permits of a semaphore of `capacity`.
    Permits {
        permits: u32,
        capacity: u32,
    },
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("excl"),
            Mode::Read => f.write_str("read"),
            Mode::Write => f.write_str("write"),
            Mode::Permits { permits, capacity } => write!(f, "sem {permits}/{capacity}"),
        }
    }
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Busy,
    WaitTimeout,
    Lost(String),
    Redis(String),
    NotReplicated,
    Config(String),
    /// The caller dropped it (cancellation).
    Cancelled,
}

impl Outcome {
    pub fn from_error(error: &lock_runtime::LockError) -> Outcome {
        use lock_runtime::LockError;
        match error {
            // Kept by `hold_at_least`: busy for the caller (the job ran).
            LockError::Busy { .. } | LockError::Kept { .. } => Outcome::Busy,
            LockError::WaitTimeout { .. } => Outcome::WaitTimeout,
            LockError::Lost { cause, .. } => Outcome::Lost(format!("{cause:?}")),
            LockError::Redis { .. } => Outcome::Redis(error.to_string()),
            LockError::NotReplicated { .. } => Outcome::NotReplicated,
            LockError::Config(_) => Outcome::Config(error.to_string()),
            _ => Outcome::Config(format!("unknown error: {error}")),
        }
    }

    pub fn is_busy(&self) -> bool {
        matches!(self, Outcome::Busy | Outcome::WaitTimeout)
    }

    fn short(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Busy => "busy".into(),
            Outcome::WaitTimeout => "wait-timeout".into(),
            Outcome::Lost(cause) => format!("lost({cause})"),
            Outcome::Redis(message) => format!("redis-error({message})"),
            Outcome::NotReplicated => "not-replicated".into(),
            Outcome::Config(message) => format!("config-error({message})"),
            Outcome::Cancelled => "cancelled".into(),
        }
    }
}

/// One call of the API.
#[derive(Clone, Debug)]
pub struct Call {
    pub id: usize,
    pub client: usize,
    pub task: usize,
    /// `acquire`, `try`, `run`, `release`...
    pub op: &'static str,
    pub keys: Vec<(String, Mode)>,
    pub options: String,
    pub start: Micros,
    pub end: Option<Micros>,
    pub outcome: Option<Outcome>,
    /// Its `wait`, for an acquisition.
    pub wait: Option<Micros>,
    /// The client's call deadline (connect + response timeout).
    pub deadline: Micros,
    /// Whether the acquisition uses a set of keys (`Lock::all`).
    pub set: bool,
    /// Inside a body that holds another lock (reentrant or nested).
    pub nested: bool,
    /// Whether it re-entered a lock its task holds.
    pub reentrant: bool,
    /// For an acquisition that returned a lock: the end of the validity the
    /// library gave it then (`HeldLock::valid_until`; a set's smallest).
    pub granted_until: Option<Micros>,
    /// The lock it returned was handed to it by another task of its client
    /// (an in-process pass), not taken from Redis by its own attempts.
    pub passed: bool,
}

/// One holder's hold of one key, by the library's own account: from the
/// acquisition's return to the first of its release, its loss and the end
/// of its validity.
#[derive(Clone, Debug)]
pub struct Hold {
    pub call: usize,
    pub client: usize,
    pub task: usize,
    pub key: String,
    pub mode: Mode,
    pub start: Micros,
    pub end: Micros,
    pub fence: Option<u64>,
    /// How its holder's call of release ended (`None`: no release call, or
    /// dropped).
    pub released: Option<Outcome>,
    pub why_ended: &'static str,
    /// Renewed (`renew`): its holder is told of a loss its renewals find.
    pub renewed: bool,
    /// When its holder let go of it (its release returned, its guard or
    /// `run` was dropped): in its process it is held until then.
    pub let_go: Micros,
}

/// A fencing token used for a key (a hold's own, or a set's over holds
/// taken further up).
#[derive(Clone, Debug)]
pub struct FenceUse {
    pub key: String,
    pub token: u64,
    pub at: Micros,
    /// When the acquisition that issued it started (`None` for a set that
    /// took the largest of its outer holds' tokens).
    pub call_start: Option<Micros>,
    pub call: usize,
}

#[derive(Default)]
pub struct Recorder {
    pub calls: Vec<Call>,
    pub holds: Vec<Hold>,
    pub fences: Vec<FenceUse>,
    pub lines: Vec<(Micros, String)>,
}

impl Recorder {
    pub fn begin(&mut self, mut call: Call) -> usize {
        call.id = self.calls.len();
        let text = format!(
            "c{}.t{} #{} {} {} [{}]{}",
            call.client,
            call.task,
            call.id,
            call.op,
            keys_text(&call.keys),
            call.options,
            if call.nested { " nested" } else { "" }
        );
        self.lines.push((call.start, text));
        self.calls.push(call);
        self.calls.len() - 1
    }

    pub fn end(&mut self, id: usize, at: Micros, outcome: Outcome, detail: String) {
        let call = &mut self.calls[id];
        call.end = Some(at);
        let text = format!(
            "c{}.t{} #{} {} -> {}{}",
            call.client,
            call.task,
            id,
            call.op,
            outcome.short(),
            detail
        );
        call.outcome = Some(outcome);
        self.lines.push((at, text));
    }

    pub fn hold(&mut self, hold: Hold) {
        let text = format!(
            "c{}.t{} #{} held {} {} [{:.3} ms, {:.3} ms) fence={} ended by {} release={}",
            hold.client,
            hold.task,
            hold.call,
            hold.key,
            hold.mode,
            hold.start as f64 / 1000.0,
            hold.end as f64 / 1000.0,
            hold.fence.map_or("-".to_owned(), |fence| fence.to_string()),
            hold.why_ended,
            hold.released
                .as_ref()
                .map_or("-".to_owned(), Outcome::short)
        );
        self.lines.push((hold.end, text));
        self.holds.push(hold);
    }

    pub fn fence(&mut self, fence: FenceUse) {
        self.fences.push(fence);
    }
}

pub fn keys_text(keys: &[(String, Mode)]) -> String {
    let mut text = String::new();
    for (at, (key, mode)) in keys.iter().enumerate() {
        if at > 0 {
            text.push(',');
        }
        let _ = write!(text, "{key}:{mode}");
    }
    text
}

/// The history's text: every line in the order it was written, with its
/// virtual time.
pub fn render(lines: &[(Micros, String)]) -> String {
    let mut text = String::new();
    for (at, line) in lines {
        let _ = writeln!(text, "{:>12.3} {line}", *at as f64 / 1000.0);
    }
    text
}
