-- LEAVE: a waiter gives up its place in the queue (wait over, an error,
-- cancelled). The holder's wake mark then names the new head; if the lock is
-- free and the leaver was first in line, the new head is told instead.
-- Preceded by publish.lua, mark.lua and prune.lua.
--
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] waiters. ARGV[1] the caller's entry.
-- Replies 1 (`{1, <error>}` when the ACL refused the message: told()).
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
  publish_to(string.sub(head, 1, bar - 1), string.sub(head, bar + 1))
end
return told(1)
