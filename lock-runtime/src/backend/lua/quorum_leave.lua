-- QUORUM_LEAVE: a waiter over a quorum gives up its place in line on one node
-- (its wait is over, it failed or was cancelled, or it won the lock on a
-- majority that did not include this node). If it was first in line and the
-- lock is free here, the new first waiter is told.
-- Preceded by publish.lua and tickets.lua.
--
-- KEYS[1] lock, KEYS[2] fence (unused), KEYS[3] tickets, KEYS[4] waiters.
-- ARGV[1] the caller's entry.
-- Replies 1.
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).
local was_first = redis.call('ZRANGE', KEYS[3], '0', '0')[1] == ARGV[1]
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if removed == 0 then return 1 end
if was_first and redis.call('EXISTS', KEYS[1]) == 0 then
  local now = redis.call('TIME')
  local now_ms = math.floor(tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000)
  local first = first_in_line(function() return now_ms end)
  if first then wake(first) end
end
return told(1)
