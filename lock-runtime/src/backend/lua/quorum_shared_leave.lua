-- QUORUM_SHARED_LEAVE: a waiter of a read/write lock or a semaphore over a
-- quorum (RedLock) gives up its place in line on one node (its wait is
-- over, or it holds on a majority). If it was first, the new first waiter
-- is told when it could enter now (so readers in line enter one after
-- another, each told when the one before it leaves).
-- Preceded by publish.lua, tickets.lua and quorum_shared.lua.
--
-- KEYS as quorum_shared_release.lua. ARGV[1] the caller's entry.
-- Replies 1 (with a refused publish, `{1, <Redis's error>}`).
local was_first = redis.call('ZRANGE', KEYS[3], '0', '0')[1] == ARGV[1]
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if removed == 1 and was_first then wake_first('') end
return told(1)
