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

/// Source of [`RENEW`], for loading it after a NOSCRIPT inside a pipeline.
pub(crate) const RENEW_SOURCE: &str = r"
local result = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held == ARGV[2 * i] then
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
pub(crate) static RENEW: Lazy<Script> = Lazy::new(|| Script::new(RENEW_SOURCE));
