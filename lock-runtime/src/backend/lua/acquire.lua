-- ACQUIRE: takes the exclusive lock if it is free and the caller may take it,
-- with a fencing token when asked; otherwise (when asked) puts the caller in
-- the queue of waiters that releases wake one at a time, and makes the
-- holder's wake mark name the head of the queue. Preceded by mark.lua and
-- prune.lua.
--
-- KEYS[1] lock (string: `<token>` or `<token>|<channel>|<waiter token>`)
-- KEYS[2] fence (the last fencing token), KEYS[3] queue (list of entries
--         `<channel>|<token>`), KEYS[4] waiters (sorted set: entry -> refresh
--         deadline in ms)
-- ARGV[1] token, ARGV[2] ttl_ms, ARGV[3] fence_retention_ms (0: no fencing
--         token), ARGV[4] waiter_timeout_ms, ARGV[5] join (1: join or refresh
--         the queue when not acquired), ARGV[6] respect (0: take a free
--         lock; 1, `fair`: only when the first live waiter that is not a
--         set's is the caller, or there is none; 2, the releaser's next
--         attempt: only when the queue is empty or the caller is first in
--         it), ARGV[7] member (the caller's entry; a set's waiter's ends in
--         `*`, and keeps its place when it takes the lock: lease/multi.rs
--         takes a set key by key and leaves once it has all), ARGV[8] mine (1: an earlier
--         attempt with this token got no answer; if the lock holds the token,
--         say so)
-- Replies {1, fence or 0} acquired; {1, fence or 0, pttl} found already
-- taken with this token (mine); {0, pttl} busy (the holder's remaining ttl
-- in ms, or -2 when the lock is free but another waiter is first in line).
-- The fencing token is the server clock in microseconds, or the last + 1 if
-- that is not larger.
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
local set = string.sub(ARGV[7], -1) == '*'
local joins = ARGV[5] == '1'
if set and joins then
  -- A set's waiter stands in line whether it takes the lock or not (the
  -- same join as below, first).
  joins = false
  if redis.call('ZADD', KEYS[4], now_ms() + timeout, ARGV[7]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[7])
  end
  redis.call('PEXPIRE', KEYS[3], timeout * 2)
  redis.call('PEXPIRE', KEYS[4], timeout * 2)
end
local head = prune(3, 4, ARGV[7], now_ms)
local may = ARGV[6] == '0' or not head or head == ARGV[7]
if not may and ARGV[6] == '1' and string.sub(head, -1) == '*' then
  -- A set's waiter (its entry ends in `*`) keeps no key from a `fair`
  -- attempt: waiting for it here could close a cycle (a holder of its other
  -- key waiting for this one). The first live waiter that is not a set's
  -- goes first, unless the caller comes before it.
  may = true
  for _, entry in ipairs(redis.call('LRANGE', KEYS[3], '0', '-1')) do
    if entry == ARGV[7] then break end
    local expiry = tonumber(redis.call('ZSCORE', KEYS[4], entry))
    if string.sub(entry, -1) ~= '*' and expiry and expiry > now_ms() then
      may = false
      break
    end
  end
end
if may then
  -- the waiter to wake after this holder: the first in line other than it
  -- (none for a set's waiter first in line: it keeps its place, and a
  -- give-back of a key it cannot use yet wakes nobody)
  local after = head
  if head == ARGV[7] then
    after = false
    if not set then after = redis.call('LINDEX', KEYS[3], '1') end
  end
  local value = ARGV[1]
  if after then value = ARGV[1] .. '|' .. after end
  if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
    if head and not set and redis.call('ZREM', KEYS[4], ARGV[7]) == 1 then
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
if joins then
  if redis.call('ZADD', KEYS[4], now_ms() + timeout, ARGV[7]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[7])
  end
  redis.call('PEXPIRE', KEYS[3], timeout * 2)
  redis.call('PEXPIRE', KEYS[4], timeout * 2)
  if not head then head = ARGV[7] end
end
mark(head)
return {0, redis.call('PTTL', KEYS[1])}
