//! The Lua scripts (their sources are the `.lua` files in `lua/`, each with a
//! header giving its KEYS, ARGV and replies). Each runs atomically in Redis:
//! no other command runs between its reads and its writes. They are sent by EVALSHA ([`evalsha`]);
//! when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH), [`run`]
//! sends the same call again as EVAL with the script's source, which runs it
//! and caches it again: one extra round trip, not two.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::LazyLock;

use redis::{
    aio::ConnectionLike, Arg, Cmd, FromRedisValue, ParsingError, RedisError, RedisResult, Script,
    Value,
};

/// A script: its source, the SHA1 that EVALSHA names it by, its bit in a
/// [`ScriptsSent`] set, and the files its source was put together from
/// (to tell on which file's line an error happened: `script_errors.rs`).
pub(crate) struct LuaScript {
    source: String,
    hash: String,
    bit: u32,
    parts: Vec<(&'static str, &'static str)>,
}

/// A `.lua` file of `lua/`: its name and its text.
macro_rules! lua {
    ($file:literal) => {
        ($file, include_str!(concat!("lua/", $file)))
    };
}

impl LuaScript {
    /// The script made of `parts` (file name, text; helpers first), in order.
    fn new(parts: &[&[(&'static str, &'static str)]], bit: u32) -> LuaScript {
        let parts = parts.concat();
        let source: String = parts.iter().map(|(_, text)| *text).collect();
        let hash = Script::new(&source).get_hash().to_owned();
        LuaScript {
            source,
            hash,
            bit,
            parts,
        }
    }

    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }

    /// Line `line` (from 1, as Redis counts them) of the source, with the
    /// file it comes from and its line there.
    pub(crate) fn line(&self, line: usize) -> Option<(&'static str, usize, &str)> {
        let text = self.source.lines().nth(line.checked_sub(1)?)?;
        let mut first = 1;
        for (file, part) in &self.parts {
            let lines = part.lines().count();
            if line < first + lines {
                return Some((file, line - first + 1, text));
            }
            first += lines;
        }
        None
    }
}

/// `EVALSHA <script> <keys>`, for the caller to add the keys and arguments
/// (`args` of them, about `bytes` long in all). Built as one command, with
/// keys and arguments written once into a buffer sized up front (the
/// `redis` crate's `ScriptInvocation` copies each twice).
pub(crate) fn evalsha(script: &LuaScript, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.hash()).arg(keys);
    cmd
}

/// The [`evalsha`] command `cmd` as `EVAL <source> ...`.
pub(crate) fn as_eval(script: &LuaScript, cmd: &Cmd) -> Cmd {
    let mut eval = Cmd::new();
    eval.arg("EVAL").arg(&script.source);
    for arg in cmd.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// Whether Redis answered that it does not know the script.
pub(crate) fn is_noscript(error: &RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// The reply of a script that may wake waiters: its code, and Redis's
/// error when the ACL refused one of its messages (`told()` in
/// `publish.lua`: the reply is then `{code, error}`). The script did
/// everything else.
pub(crate) struct Told {
    pub(crate) code: i64,
    pub(crate) refused: Option<String>,
}

impl FromRedisValue for Told {
    fn from_redis_value(value: Value) -> Result<Told, ParsingError> {
        match value {
            Value::Array(mut items) if items.len() == 2 => {
                let said = items.pop().unwrap_or(Value::Nil);
                let code = i64::from_redis_value(items.pop().unwrap_or(Value::Nil))?;
                Ok(Told {
                    code,
                    refused: Some(String::from_redis_value(said)?),
                })
            }
            value => Ok(Told {
                code: i64::from_redis_value(value)?,
                refused: None,
            }),
        }
    }
}

/// The scripts one client has had run by Redis: the first call of each is
/// sent as EVAL (which caches it), so that a fresh client's first acquire,
/// release or renewal costs one round trip, not the three of EVALSHA,
/// NOSCRIPT, EVAL.
#[derive(Default)]
pub(crate) struct ScriptsSent(AtomicU32);

impl ScriptsSent {
    pub(crate) fn has(&self, script: &LuaScript) -> bool {
        self.0.load(Ordering::Relaxed) & script.bit != 0
    }

    pub(crate) fn add(&self, script: &LuaScript) {
        self.0.fetch_or(script.bit, Ordering::Relaxed);
    }
}

/// Runs an [`evalsha`] command: as EVAL if this client never ran the script;
/// again as EVAL if Redis lost it (a restart, SCRIPT FLUSH), which also
/// caches it again.
pub(crate) async fn run<T: FromRedisValue>(
    script: &LuaScript,
    cmd: &Cmd,
    connection: &mut impl ConnectionLike,
    sent: &ScriptsSent,
) -> RedisResult<T> {
    let result = if sent.has(script) {
        match cmd.query_async(connection).await {
            Err(error) if is_noscript(&error) => as_eval(script, cmd).query_async(connection).await,
            result => result,
        }
    } else {
        as_eval(script, cmd).query_async(connection).await
    };
    if result.is_ok() {
        sent.add(script);
    }
    result
}

// The exclusive lock. A held lock's value is its holder's token, followed by
// `|<channel>|<token>` (the "wake mark") while waiters are queued behind it:
// the queue entry of the first of them, the one its release must wake. The
// release then needs neither the queue nor a second key: an uncontended
// release is GET + DEL on the lock key alone. Every script that changes the
// head of the queue while the lock is held rewrites the mark (docs/design.md
// §4).

/// `publish.lua`: PUBLISH, or SPUBLISH for a cluster's per-slot channel.
const PUBLISH: (&str, &str) = lua!("publish.lua");

/// `publish.lua`, `mark.lua` and `prune.lua`: helpers put in front of the
/// scripts that use them.
const HELPERS: [(&str, &str); 3] = [lua!("publish.lua"), lua!("mark.lua"), lua!("prune.lua")];

/// `lua/acquire.lua`: take a free lock (maybe with a fencing token), or
/// join the queue.
pub(crate) static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&HELPERS, &[lua!("acquire.lua")]], 1));

/// `lua/acquire_all.lua`: take every lock of a set whose keys share a
/// node (and a slot), or none; or join every one's queue.
pub(crate) static ACQUIRE_ALL: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("prune.lua")], &[lua!("acquire_all.lua")]], 1 << 25));

/// `lua/release.lua`: compare-and-delete, waking the marked waiter. The
/// helpers come after the common case, which returns before them
/// (`release.lua`'s header).
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&[lua!("release.lua"), PUBLISH, lua!("release_wake.lua")]],
        2,
    )
});

/// `publish.lua` and `tickets.lua`: the helpers of the quorum scripts.
const QUORUM_HELPERS: [(&str, &str); 2] = [lua!("publish.lua"), lua!("tickets.lua")];

/// `lua/quorum_acquire.lua`: one node's part of an attempt over a quorum:
/// take a free lock if nobody is ahead in line, or join the line.
pub(crate) static QUORUM_ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&QUORUM_HELPERS, &[lua!("quorum_acquire.lua")]], 1 << 18));

/// `lua/quorum_release.lua`: the release (or a failed attempt's give-back)
/// on one node of a quorum, waking the first waiter in line there. The
/// helpers come after the common case, which returns before them
/// (`quorum_release.lua`'s header).
pub(crate) static QUORUM_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[
            &[lua!("quorum_release.lua")],
            &QUORUM_HELPERS,
            &[lua!("quorum_release_wake.lua")],
        ],
        1 << 17,
    )
});

/// `lua/quorum_handoff.lua`: one node's part of an in-process hand-off over
/// a quorum.
pub(crate) static QUORUM_HANDOFF: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("quorum_handoff.lua")]], 1 << 27));

/// `lua/quorum_leave.lua`: a waiter over a quorum gives up its place on one
/// node.
pub(crate) static QUORUM_LEAVE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&QUORUM_HELPERS, &[lua!("quorum_leave.lua")]], 1 << 19));

/// The helpers of the quorum scripts of read/write locks and semaphores.
const QUORUM_SHARED_HELPERS: [(&str, &str); 3] = [
    lua!("publish.lua"),
    lua!("tickets.lua"),
    lua!("quorum_shared.lua"),
];

/// `lua/quorum_rw_acquire.lua`: one node's part of an attempt over a quorum
/// for a read share or the write side.
pub(crate) static QUORUM_RW_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&QUORUM_SHARED_HELPERS, &[lua!("quorum_rw_acquire.lua")]],
        1 << 20,
    )
});

/// `lua/quorum_semaphore_acquire.lua`: one node's part of an attempt over a
/// quorum for a semaphore's permits (named slots).
pub(crate) static QUORUM_SEMAPHORE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[
            &QUORUM_SHARED_HELPERS,
            &[lua!("quorum_semaphore_acquire.lua")],
        ],
        1 << 21,
    )
});

/// `lua/quorum_shared_release.lua`: the release (or a failed attempt's
/// give-back) of a share, a writer or permits on one node of a quorum.
pub(crate) static QUORUM_SHARED_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&QUORUM_SHARED_HELPERS, &[lua!("quorum_shared_release.lua")]],
        1 << 23,
    )
});

/// `lua/quorum_shared_leave.lua`: a waiter of a shared kind over a quorum
/// gives up its place on one node.
pub(crate) static QUORUM_SHARED_LEAVE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&QUORUM_SHARED_HELPERS, &[lua!("quorum_shared_leave.lua")]],
        1 << 24,
    )
});

/// `lua/release_keeping.lua`: the `hold_at_least` release.
pub(crate) static RELEASE_KEEPING: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("release_keeping.lua")]], 4));

/// `lua/leave.lua`: a waiter gives up its place.
pub(crate) static LEAVE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&HELPERS, &[lua!("leave.lua")]], 8));

/// `lua/renew.lua`: extend many locks of one client, each only if it holds
/// its token.
pub(crate) static RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("renew.lua")]], 16));

/// The flag that lets a script touch keys of several slots of its node
/// (Redis 7; a Redis Cluster's renewals, grouped by primary), and
/// `any_slot.lua`, which takes the keys from ARGV (a script's declared keys
/// must still share a slot).
const ANY_SLOT: [(&str, &str); 2] = [
    ("the shebang", "#!lua flags=allow-cross-slot-keys\n"),
    lua!("any_slot.lua"),
];

/// `lua/renew.lua` for a cluster's primary: locks of any of its slots.
pub(crate) static RENEW_ANY_SLOT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&ANY_SLOT, &[lua!("renew.lua")]], 8192));

/// `lua/fence_raise.lua`: a quorum's write-back of a fencing token.
pub(crate) static FENCE_RAISE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("fence_raise.lua")]], 32768));

/// `lua/handoff.lua`: pass a held lock to the next task of the process.
pub(crate) static HANDOFF: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("handoff.lua")]], 32));

// The shared-holder kinds (read/write locks, semaphores): each holder has
// its own token and its own expiry, a score on the server clock in a sorted
// set (docs/design.md §11). Their helpers are fragments put in front.

/// `publish.lua` and `shares.lua`: the server clock, `expire_at_least`,
/// grouped publishing.
const SHARES: [(&str, &str); 2] = [lua!("publish.lua"), lua!("shares.lua")];

/// `lua/rw_acquire.lua`: take a read share or the write side.
pub(crate) static RW_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&SHARES, &[lua!("rw_state.lua")], &[lua!("rw_acquire.lua")]],
        64,
    )
});

/// `lua/rw_release.lua`: end a share, waking who may enter now.
pub(crate) static RW_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&SHARES, &[lua!("rw_state.lua")], &[lua!("rw_release.lua")]],
        128,
    )
});

/// `lua/rw_leave.lua`: a waiter of a read/write lock gives up its place.
pub(crate) static RW_LEAVE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[&SHARES, &[lua!("rw_state.lua")], &[lua!("rw_leave.lua")]],
        256,
    )
});

/// `lua/semaphore_acquire.lua`: take permits, or join the queue.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[
            &SHARES,
            &[lua!("semaphore.lua")],
            &[lua!("semaphore_acquire.lua")],
        ],
        512,
    )
});

/// `lua/semaphore_release.lua`: give permits back, waking who fits now.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[
            &SHARES,
            &[lua!("semaphore.lua")],
            &[lua!("semaphore_release.lua")],
        ],
        1024,
    )
});

/// `lua/semaphore_leave.lua`: a waiter of a semaphore gives up its place.
pub(crate) static SEMAPHORE_LEAVE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        &[
            &SHARES,
            &[lua!("semaphore.lua")],
            &[lua!("semaphore_leave.lua")],
        ],
        2048,
    )
});

/// `lua/renew_shares.lua` for a cluster's primary: shares of any of its
/// slots.
pub(crate) static RENEW_SHARES_ANY_SLOT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&ANY_SLOT, &SHARES, &[lua!("renew_shares.lua")]], 16384));

/// `lua/renew_shares.lua`: extend many read shares and permits of one
/// client, each only while it is live.
pub(crate) static RENEW_SHARES: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&SHARES, &[lua!("renew_shares.lua")]], 4096));

/// `lua/inspect.lua`: a read-only snapshot of the three locks of one name
/// (the admin API, lockctl).
pub(crate) static INSPECT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("inspect.lua")]], 65536));

/// `lua/peek.lua`: an exclusive lock's value and PTTL (`Lock::holder`).
pub(crate) static PEEK: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("peek.lua")]], 1 << 26));

/// Every script, for finding one by its SHA1.
pub(crate) fn all() -> [&'static LuaScript; 28] {
    [
        &QUORUM_RW_ACQUIRE,
        &QUORUM_SEMAPHORE_ACQUIRE,
        &QUORUM_SHARED_RELEASE,
        &QUORUM_SHARED_LEAVE,
        &ACQUIRE,
        &ACQUIRE_ALL,
        &RELEASE,
        &QUORUM_ACQUIRE,
        &QUORUM_RELEASE,
        &QUORUM_LEAVE,
        &QUORUM_HANDOFF,
        &RELEASE_KEEPING,
        &LEAVE,
        &RENEW,
        &RENEW_ANY_SLOT,
        &FENCE_RAISE,
        &HANDOFF,
        &RW_ACQUIRE,
        &RW_RELEASE,
        &RW_LEAVE,
        &SEMAPHORE_ACQUIRE,
        &SEMAPHORE_RELEASE,
        &SEMAPHORE_LEAVE,
        &RENEW_SHARES_ANY_SLOT,
        &RENEW_SHARES,
        &INSPECT,
        &RECORD,
        &PEEK,
    ]
}

/// `lua/record.lua`: write (or delete) a client's holder record, in the
/// background.
pub(crate) static RECORD: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(&[&[lua!("record.lua")]], 1 << 22));

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script has its own bit in [`ScriptsSent`]: two scripts sharing
    /// one would let the second go out as an `EVALSHA` that Redis has never
    /// seen (a `NOSCRIPT` and a second round trip).
    #[test]
    fn every_script_has_its_own_bit() {
        let mut seen = 0u32;
        for script in all() {
            assert_eq!(script.bit.count_ones(), 1, "{}", script.hash());
            assert_eq!(seen & script.bit, 0, "bit {} used twice", script.bit);
            seen |= script.bit;
        }
    }

    /// A line of a script is found in the file it comes from.
    #[test]
    fn lines_are_found_in_their_files() {
        let (file, line, text) = RELEASE.line(1).unwrap();
        assert_eq!((file, line), ("release.lua", 1));
        assert!(text.starts_with("--"));
        let head_lines = include_str!("lua/release.lua").lines().count();
        let (file, line, text) = RELEASE.line(head_lines + 1).unwrap();
        assert_eq!((file, line), ("publish.lua", 1));
        assert_eq!(
            text,
            include_str!("lua/publish.lua").lines().next().unwrap()
        );
        let helper_lines = include_str!("lua/publish.lua").lines().count();
        let (file, line, _) = RELEASE.line(head_lines + helper_lines + 1).unwrap();
        assert_eq!((file, line), ("release_wake.lua", 1));
        let (file, line, _) = ACQUIRE.line(1).unwrap();
        assert_eq!((file, line), ("publish.lua", 1));
        let (file, line, _) = RENEW_ANY_SLOT.line(1).unwrap();
        assert_eq!((file, line), ("the shebang", 1));
        assert!(RELEASE.line(0).is_none());
        assert!(RELEASE.line(100_000).is_none());
    }
}
