-- RELEASE: deletes the lock only if it holds the caller's token and, if its
-- wake mark names a waiter, publishes that waiter's token on its client's
-- channel.
--
-- KEYS[1] lock. ARGV[1] token.
-- Put together as release.lua, publish.lua, release_wake.lua: the common
-- case (no wake mark) returns before publish.lua's helpers are defined.
-- A script defines its local functions anew on every run, a closure each,
-- which made an uncontended release cost 1.8 against 1.3 us in Redis.
-- Replies 2 released and the message was received by the waiter's client,
-- 1 released (nobody to wake, or nobody listening; `{1, <error>}` when the
-- ACL refused the message: publish.lua's told()), 0 the key was gone
-- (expired), -1 another holder's token is there (left untouched).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == false then return 0 end
