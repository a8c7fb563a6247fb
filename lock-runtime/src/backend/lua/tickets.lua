-- Helper, included by the quorum (RedLock) scripts that read a lock's line
-- of waiters on one node. Over a quorum waiters queue in a sorted set,
-- KEYS[3] (`:tickets`, entry -> ticket), ordered by a ticket that each waiter
-- sends unchanged to every node, so that every node puts its waiters in the
-- same order and names the same one first; KEYS[4] (`:waiters`, entry ->
-- refresh deadline in ms on this node's clock) drops a waiter that stopped
-- refreshing its place.
-- first_in_line(now_ms): drops the waiters whose place expired from the
-- front of the line and returns the first live one's entry, or false.
-- now_ms() is the server clock in ms.
local function first_in_line(now_ms)
  while true do
    local first = redis.call('ZRANGE', KEYS[3], '0', '0')[1]
    if not first then return false end
    local deadline = tonumber(redis.call('ZSCORE', KEYS[4], first))
    if deadline and deadline > now_ms() then return first end
    redis.call('ZREM', KEYS[3], first)
    redis.call('ZREM', KEYS[4], first)
  end
end
-- wake(entry): publishes the waiter's token on its client's channel (an
-- entry is `<channel>|<token>`).
local function wake(entry)
  local bar = string.find(entry, '|', 1, true)
  if bar then publish_to(string.sub(entry, 1, bar - 1), string.sub(entry, bar + 1)) end
end
