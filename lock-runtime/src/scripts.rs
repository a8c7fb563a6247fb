//! The Lua scripts. Each runs atomically in Redis: no other command runs
//! between its reads and its writes. They are sent by EVALSHA ([`evalsha`]);
//! when Redis answers NOSCRIPT (after a restart or SCRIPT FLUSH), [`run`]
//! sends the same call again as EVAL with the script's source, which runs it
//! and caches it again: one extra round trip, not two.

use std::sync::atomic::{AtomicU8, Ordering};

use once_cell::sync::Lazy;
use redis::{aio::ConnectionLike, Arg, Cmd, FromRedisValue, RedisError, RedisResult, Script};

/// A script: its source, the SHA1 that EVALSHA names it by, and its bit in
/// a [`ScriptsSent`] set.
pub(crate) struct LuaScript {
    source: String,
    hash: String,
    bit: u8,
}

impl LuaScript {
    fn new(source: String, bit: u8) -> LuaScript {
        let hash = Script::new(&source).get_hash().to_owned();
        LuaScript { source, hash, bit }
    }

    pub(crate) fn hash(&self) -> &str {
        &self.hash
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

/// The scripts one client has had run by Redis: the first call of each is
/// sent as EVAL (which caches it), so that a fresh client's first acquire,
/// release or renewal costs one round trip, not the three of EVALSHA,
/// NOSCRIPT, EVAL.
#[derive(Default)]
pub(crate) struct ScriptsSent(AtomicU8);

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

// A held lock's value is its holder's token, followed by `|<channel>|<token>`
// (the "wake" mark) while waiters are queued behind it: the queue entry of
// the first of them, the one its release must wake. The release then needs
// neither the queue nor a second key: an uncontended release is GET + DEL on
// the lock key alone, like a bare compare-and-delete. Every script that
// changes the head of the queue while the lock is held (a waiter joining an
// empty queue, a waiter taking the lock with others left behind it, the
// pruning of a waiter that stopped refreshing its place, a waiter leaving)
// rewrites the mark to name the new head. A lock taken by a plain `SET NX
// PX` ahead of queued waiters is unmarked until one of them tries again:
// each was woken by the release before (and so tries at once), or wakes by
// its own timer (the holder's expiry, its queue refresh) at the latest.

/// Lua: `mark(head)` makes the held lock's mark name `head` (or removes the
/// mark when `head` is false), keeping the holder's token and the key's ttl.
/// Does nothing when the lock is free.
const MARK: &str = r"
local function mark(head)
  local held = redis.call('GET', KEYS[1])
  if not held then return end
  local owner = held
  local bar = string.find(held, '|', 1, true)
  if bar then owner = string.sub(held, 1, bar - 1) end
  local wanted = owner
  if head then wanted = owner .. '|' .. head end
  if wanted ~= held then redis.call('SET', KEYS[1], wanted, 'KEEPTTL') end
end
";

/// Lua: drops waiters that stopped refreshing their place from the head of
/// the queue (KEYS[q], deadlines in KEYS[w]), up to `stop` (a member never
/// dropped, or false); returns the new head or false.
const PRUNE: &str = r"
local function prune(q, w, stop, now_ms)
  local head = redis.call('LINDEX', KEYS[q], '0')
  while head and head ~= stop do
    local expiry = tonumber(redis.call('ZSCORE', KEYS[w], head))
    if expiry and expiry > now_ms() then break end
    redis.call('LPOP', KEYS[q])
    redis.call('ZREM', KEYS[w], head)
    head = redis.call('LINDEX', KEYS[q], '0')
  end
  return head
end
";

/// Takes the lock if it is free and the caller may take it, with a fencing
/// token when asked, in one step; otherwise (when asked) puts the caller in
/// the queue of waiters that releases wake one at a time, and makes the
/// holder's wake mark name the head of the queue. (An uncontended try that
/// needs neither the queue nor a fencing token is a plain `SET NX PX`
/// instead.)
///
/// KEYS = lock, fence, queue, waiters.
/// ARGV = token, ttl_ms,
///        fence_retention_ms (0: no fencing token; the fence key is untouched),
///        waiter_timeout_ms,
///        join (1: join or refresh a place in the queue when not acquired),
///        respect (1: only take a free lock when the queue is empty or the
///        caller is first in it, as in fair mode; 0: take any free lock),
///        member (the caller's queue entry: `<its client's channel>|<token>`),
///        mine (1: an earlier attempt with this token got no answer; if the
///        lock holds the token, that attempt took it: say so, with the
///        fencing token it was given).
/// Returns `{1, fencing_token or 0}` when acquired, `{1, fencing_token or 0,
/// pttl}` when `mine` found the lock already taken with this token (its
/// remaining ttl bounds the holder's validity), else `{0, pttl}` (the
/// holder's remaining ttl in ms, or -2 when the lock is free but another
/// waiter is first in line).
///
/// Waiters that stopped refreshing their place (crashed, or left without
/// saying so) are dropped from the head of the queue after the timeout.
///
/// The fencing token is the Redis server's clock in microseconds, or the
/// last token + 1 if that is not larger: strictly increasing per key while
/// the fence key lives, and across its expiry as long as the server clock
/// does not step back.
pub(crate) static ACQUIRE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new([MARK, PRUNE, ACQUIRE_BODY].concat(), 1));

const ACQUIRE_BODY: &str = r"
if ARGV[8] == '1' then
  local held = redis.call('GET', KEYS[1])
  if held and (held == ARGV[1] or string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then
    local fence = 0
    if ARGV[3] ~= '0' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 end
    return {1, fence, redis.call('PTTL', KEYS[1])}
  end
end
local timeout = tonumber(ARGV[4])
local now_us = false
local function now_ms()
  if not now_us then
    local now = redis.call('TIME')
    now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return math.floor(now_us / 1000)
end
local head = prune(3, 4, ARGV[7], now_ms)
local may = ARGV[6] == '0' or not head or head == ARGV[7]
if may then
  -- the waiter to wake after this holder: the first in line other than it
  local after = head
  if head == ARGV[7] then after = redis.call('LINDEX', KEYS[3], '1') end
  local value = ARGV[1]
  if after then value = ARGV[1] .. '|' .. after end
  if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
    if head and redis.call('ZREM', KEYS[4], ARGV[7]) == 1 then
      redis.call('LREM', KEYS[3], '1', ARGV[7])
    end
    if ARGV[3] == '0' then return {1, 0} end
    now_ms()
    local fence = now_us
    local last = tonumber(redis.call('GET', KEYS[2]))
    if last and last >= fence then fence = last + 1 end
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
    return {1, fence}
  end
end
if ARGV[5] == '1' then
  if redis.call('ZADD', KEYS[4], now_ms() + timeout, ARGV[7]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[7])
  end
  redis.call('PEXPIRE', KEYS[3], timeout * 2)
  redis.call('PEXPIRE', KEYS[4], timeout * 2)
  if not head then head = ARGV[7] end
end
mark(head)
return {0, redis.call('PTTL', KEYS[1])}
";

/// Releases the lock only if it still holds the caller's token: deletes it
/// and, if its wake mark names a waiter, publishes that waiter's token on
/// its client's channel (the mark is `<channel>|<token>`).
///
/// KEYS = lock. ARGV = token.
/// Returns 2 when released with the message received by the waiter's
/// client, 1 when released (nobody to wake, or nobody listening), 0 when the
/// key was gone (expired), -1 when another holder's token is there (left
/// untouched).
pub(crate) static RELEASE: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == false then return 0 end
local mine = #ARGV[1] + 1
if string.sub(held, 1, mine) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
local waiter = string.sub(held, mine + 1)
local bar = string.find(waiter, '|', 1, true)
if not bar then return 1 end
-- 2 only if a client listens on the waiter's channel
if redis.call('PUBLISH', string.sub(waiter, 1, bar - 1), string.sub(waiter, bar + 1)) > 0 then return 2 end
return 1
"
        .to_owned(),
        2,
    )
});

/// `hold_at_least`: instead of deleting the lock, keeps it for `keep_ms`
/// more (the rest of the minimum hold), if it still holds the caller's
/// token. The kept value is `kept:<token>`, which no longer answers to the
/// holder's token: a renewal that reaches Redis after this release (one
/// already on the wire, or re-sent after a NOSCRIPT) finds another value and
/// extends nothing. Wakes nobody: waiters sleep at most until the key's
/// expiry.
///
/// KEYS = lock. ARGV = token, keep_ms. Returns 1 when kept (or already kept
/// by an earlier attempt of this release), 0 when the key was gone, -1 when
/// another holder's token is there.
pub(crate) static RELEASE_KEEPING: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"
local held = redis.call('GET', KEYS[1])
if held == false then return 0 end
local kept = 'kept:' .. ARGV[1]
if held == kept or string.sub(held, 1, #kept + 1) == kept .. '|' then return 1 end
if held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('SET', KEYS[1], kept, 'PX', ARGV[2])
return 1
"
        .to_owned(),
        4,
    )
});

/// A waiter gives up its place (wait ran out, an error, or it was cancelled).
///
/// KEYS = lock, queue, waiters. ARGV = member (`<channel>|<token>`).
/// The holder's wake mark then names the new head of the queue; if the lock
/// is free and the leaver was first in line, the new head is told instead.
pub(crate) static LEAVE: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new([MARK, PRUNE, LEAVE_BODY].concat(), 8));

const LEAVE_BODY: &str = r"
local first = redis.call('LINDEX', KEYS[2], '0') == ARGV[1]
redis.call('LREM', KEYS[2], '0', ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local head = prune(2, 3, false, now_ms)
if redis.call('EXISTS', KEYS[1]) == 1 then
  mark(head)
elseif first and head then
  local bar = string.find(head, '|', 1, true)
  redis.call('PUBLISH', string.sub(head, 1, bar - 1), string.sub(head, bar + 1))
end
return 1
";

/// Source of [`RENEW`].
const RENEW_SOURCE: &str = r"
local result = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held == ARGV[2 * i] or (held and string.sub(held, 1, #ARGV[2 * i] + 1) == ARGV[2 * i] .. '|') then
    redis.call('PEXPIRE', key, ARGV[2 * i - 1])
    result[i] = 1
  elseif held == false then
    result[i] = 0
  else
    result[i] = -1
  end
end
return result
";

/// Extends each lock's expiry only if it still holds that lock's token.
///
/// KEYS = lock keys; ARGV = ttl_ms_1, token_1, ttl_ms_2, token_2, ...
/// Returns one code a key: 1 extended, 0 key gone, -1 another holder's token
/// (left untouched). One call renews up to 100 locks of one client, so all
/// its keys must live on one Redis node (group by slot on a cluster).
pub(crate) static RENEW: Lazy<LuaScript> =
    Lazy::new(|| LuaScript::new(RENEW_SOURCE.to_owned(), 16));

/// Passes a held lock from one holder of a process to the next (the
/// in-process hand-off): if the lock still holds the caller's token (with or
/// without a wake mark), gives it the next holder's token with that
/// holder's ttl, keeping the mark, and a new fencing token when asked.
///
/// KEYS = lock, fence. ARGV = token, next token, next ttl_ms,
/// fence_retention_ms (0: no fencing token).
/// Returns `{1, fencing_token or 0, queued}` when passed (`queued`: 1 if
/// waiters of other clients are queued in Redis, as the wake mark shows), or
/// already passed by an earlier attempt of this call; `{0}` when the key was
/// gone, `{-1}` when another holder's token is there.
pub(crate) static HANDOFF: Lazy<LuaScript> = Lazy::new(|| {
    LuaScript::new(
        r"
local held = redis.call('GET', KEYS[1])
if held == false then return {0} end
local function starts(value, token)
  return value == token or string.sub(value, 1, #token + 1) == token .. '|'
end
if starts(held, ARGV[2]) then
  -- sent again after an attempt whose answer was lost: already passed
  local fence = 0
  if ARGV[4] ~= '0' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 end
  local queued = 0
  if held ~= ARGV[2] then queued = 1 end
  return {1, fence, queued}
end
local mark = ''
if held ~= ARGV[1] then
  if string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return {-1} end
  mark = string.sub(held, #ARGV[1] + 1)
end
redis.call('SET', KEYS[1], ARGV[2] .. mark, 'PX', ARGV[3])
local queued = 0
if mark ~= '' then queued = 1 end
if ARGV[4] == '0' then return {1, 0, queued} end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]))
if last and last >= fence then fence = last + 1 end
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[4])
return {1, fence, queued}
"
        .to_owned(),
        32,
    )
});
