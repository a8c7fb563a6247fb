//! The Lua scripts. Each runs atomically in Redis: no other command runs
//! between its reads and its writes. They are sent by EVALSHA; the `redis`
//! crate loads a script and retries once when Redis answers NOSCRIPT (after a
//! restart or SCRIPT FLUSH).

use once_cell::sync::Lazy;
use redis::Script;

/// Deletes the lock only if it still holds the caller's token.
///
/// KEYS[1] = lock key, ARGV[1] = token.
/// Returns 1 when released, 0 when the key was gone (expired), -1 when
/// another holder's token is there (left untouched).
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
elseif held == false then
  return 0
end
return -1
",
    )
});
