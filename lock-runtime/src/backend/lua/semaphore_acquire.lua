-- semaphore_acquire: takes k permits of a semaphore of capacity N (at most N
-- permits held at once) if the caller may have them, in one step; otherwise
-- (when asked) joins or refreshes the caller's place in the queue of
-- waiters that releases wake.
--
-- KEYS = permits (ZSET: member `<k>|<token>` per holder, score = its expiry
--        in ms on the server clock; plus one member `#capacity:<N>` with
--        score +inf recording the capacity while anybody holds),
--        queue (LIST of entries `<k>|<channel>|<token>`),
--        deadlines (ZSET: queue entry -> ms by which its waiter must refresh).
-- ARGV = token, ttl_ms, k (permits wanted, >= 1), capacity N,
--        waiter_timeout_ms,
--        join (1: join or refresh the caller's place when not acquired),
--        fair (1: respect the queue; 0: take any permits free now),
--        entry (the caller's queue entry: `<k>|<channel>|<token>`),
--        mine (1: an earlier attempt with this token got no answer; if the
--        caller holds `<k>|<token>`, that attempt took it: say so).
-- Returns {1, 0} when acquired;
--         {1, 0, remaining_ms} when `mine` found the permits already held;
--         {0, hint_ms} when not acquired: the ms until the earliest live
--         holder expires, or -2 when blocked only by the queue;
--         {-3, stored_N} when the semaphore is held with another capacity
--         (nothing changed);
--         {-4, N} when k > N (can never be granted; nothing changed).
--
-- Expired holders are removed first. Once nobody holds, the capacity member
-- goes too (the key also expires with the last holder: its ttl is never
-- shortened), so the semaphore can be reopened with another N.
-- The caller may enter iff used + k <= N and, when fair, the queued entries
-- ahead of its own (the whole queue when it is not queued) fit as well:
-- used + (their k) + k <= N. With nobody ahead that is `first in line`;
-- entries ahead that fit are the ones a release wakes together, so any of
-- them may enter in any order without overtaking one that does not fit.
-- Waiters that stopped refreshing their place are dropped from the whole
-- queue (never the caller's own entry: it is refreshing right now).
--
-- Preceded by shares.lua and semaphore.lua.

local token, ttl = ARGV[1], tonumber(ARGV[2])
local k, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local timeout = tonumber(ARGV[5])
local entry = ARGV[8]
local member = ARGV[3] .. '|' .. token
if not k or k < 1 or not n then return redis.error_reply('ERR semaphore: k must be >= 1 and N a number') end

if ARGV[9] == '1' then
  local expiry = tonumber(redis.call('ZSCORE', KEYS[1], member))
  if expiry and expiry > now_ms() then return {1, 0, expiry - now_ms()} end
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
local held = redis.call('ZRANGE', KEYS[1], '0', '-1')
local capacity = false
local used = 0
for _, holder in ipairs(held) do
  if string.sub(holder, 1, 10) == '#capacity:' then
    capacity = tonumber(string.sub(holder, 11))
  else
    used = used + permits(holder)
  end
end
if capacity and #held == 1 then
  -- nobody holds: the capacity is free to change
  redis.call('DEL', KEYS[1])
  capacity = false
end
if capacity and capacity ~= n then return {-3, capacity} end
if k > n then return {-4, n} end

local live, position = live_queue(KEYS[2], KEYS[3], entry)

local hint = -2
local may = used + k <= n
if not may then
  local earliest = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
  hint = tonumber(earliest[2]) - now_ms()
elseif ARGV[7] == '1' then
  local ahead = #live
  if position then ahead = position - 1 end
  local reserved = 0
  for i = 1, ahead do reserved = reserved + permits(live[i]) end
  may = used + reserved + k <= n
end

if may then
  redis.call('ZADD', KEYS[1], now_ms() + ttl, member)
  if not capacity then
    redis.call('ZADD', KEYS[1], '+inf', '#capacity:' .. string.format('%.0f', n))
  end
  expire_at_least(KEYS[1], ttl)
  if redis.call('ZREM', KEYS[3], entry) == 1 or position then
    redis.call('LREM', KEYS[2], '0', entry)
  end
  return {1, 0}
end

if ARGV[6] == '1' then
  redis.call('ZADD', KEYS[3], now_ms() + timeout, entry)
  if not position then redis.call('RPUSH', KEYS[2], entry) end
  expire_at_least(KEYS[2], timeout * 2)
  expire_at_least(KEYS[3], timeout * 2)
end
return {0, hint}
