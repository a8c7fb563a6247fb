-- ACQUIRE ALL: takes every exclusive lock of a set, or none (a multi-key
-- lock whose keys all live on one node, in one slot on a Redis Cluster).
-- With one token for the whole set; with one fencing token, larger than the
-- last token of every key, written to every key's fence. Otherwise (when
-- asked) puts the caller in the queue of every key of the set, so that the
-- release of any of them wakes it (a place that keeps no key: acquire.lua
-- lets a `fair` locker pass it), and makes each holder's wake mark name its
-- queue's head.
-- Preceded by prune.lua (the marks are written by mark_at below: mark.lua's
-- mark, for the lock key of a given index).
--
-- KEYS: for each lock of the set, 4 keys: lock, fence, queue, waiters (as
--       in acquire.lua), in the set's order.
-- ARGV[1] token, ARGV[2] ttl_ms, ARGV[3] fence_retention_ms (0: no fencing
--         token), ARGV[4] waiter_timeout_ms, ARGV[5] join (1: join or
--         refresh every queue of the set when not acquired), ARGV[6]
--         respect (0: take a free lock; 1, `fair`: only when the first live
--         waiter in its queue that is not a set's is the caller, or there is
--         none, as acquire.lua; 2, the releaser's next attempt: only when
--         its queue is empty or the caller is first in it), ARGV[7] member
--         (the caller's entry, the same in every queue:
--         `<channel>|<token>*`), ARGV[8] mine (1: an earlier attempt with
--         this token got no answer)
-- Replies {1, fence or 0} acquired; {1, fence or 0, pttl} found already
-- taken with this token by an earlier attempt (mine; the smallest pttl);
-- {0, i, pttl} busy: the i-th lock of the set (from 1) is held (its
-- remaining ttl in ms) or free with another waiter first (-2).
local n = #KEYS / 4
local token = ARGV[1]
local function starts(value)
  return value == token or string.sub(value, 1, #token + 1) == token .. '|'
end
if ARGV[8] == '1' then
  -- One script sets every key or none: a lost attempt that took the set
  -- left the token in every key that has not expired since.
  local all, least = true, -1
  for i = 1, n do
    local lock = 4 * i - 3
    local held = redis.call('GET', KEYS[lock])
    if held and starts(held) then
      local pttl = redis.call('PTTL', KEYS[lock])
      if least < 0 or pttl < least then least = pttl end
    else
      all = false
    end
  end
  if all then
    local fence = 0
    if ARGV[3] ~= '0' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 end
    return {1, fence, least}
  end
  -- Some of them expired: give back the others, and try afresh below.
  for i = 1, n do
    local lock = 4 * i - 3
    local held = redis.call('GET', KEYS[lock])
    if held and starts(held) then redis.call('DEL', KEYS[lock]) end
  end
end
local timeout = tonumber(ARGV[4])
local member = ARGV[7]
local now_us = false
local function now_ms()
  if not now_us then
    local now = redis.call('TIME')
    now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return math.floor(now_us / 1000)
end
-- mark.lua's mark(head) for the lock KEYS[lock].
local function mark_at(lock, head)
  local held = redis.call('GET', KEYS[lock])
  if not held then return end
  local owner = held
  local bar = string.find(held, '|', 1, true)
  if bar and string.sub(held, bar + 1, bar + 1) == 'q' then return end
  if bar then owner = string.sub(held, 1, bar - 1) end
  local wanted = owner
  if head then wanted = owner .. '|' .. head end
  if wanted ~= held then redis.call('SET', KEYS[lock], wanted, 'KEEPTTL') end
end
local heads = {}
local busy, busy_ttl = 0, -2
for i = 1, n do
  local lock = 4 * i - 3
  local head = prune(lock + 2, lock + 3, member, now_ms)
  heads[i] = head
  if busy == 0 then
    if redis.call('EXISTS', KEYS[lock]) == 1 then
      busy, busy_ttl = i, redis.call('PTTL', KEYS[lock])
    elseif ARGV[6] == '2' and head and head ~= member then
      busy = i
    elseif ARGV[6] == '1' and head and head ~= member then
      -- a set's waiter (its id ends in `*`) keeps no key: waiting for it
      -- could close a cycle (two sets each first in a queue the other
      -- needs; acquire.lua does the same for single locks). The first live
      -- waiter that is not a set's goes first, unless the caller is ahead.
      for _, entry in ipairs(redis.call('LRANGE', KEYS[lock + 2], '0', '-1')) do
        if entry == member then break end
        local expiry = tonumber(redis.call('ZSCORE', KEYS[lock + 3], entry))
        if string.sub(entry, -1) ~= '*' and expiry and expiry > now_ms() then
          busy = i
          break
        end
      end
    end
  end
end
if busy == 0 then
  for i = 1, n do
    local lock = 4 * i - 3
    local after = heads[i]
    if after == member then after = redis.call('LINDEX', KEYS[lock + 2], '1') end
    local value = token
    if after then value = token .. '|' .. after end
    redis.call('SET', KEYS[lock], value, 'PX', ARGV[2])
    if heads[i] and redis.call('ZREM', KEYS[lock + 3], member) == 1 then
      redis.call('LREM', KEYS[lock + 2], '1', member)
    end
  end
  if ARGV[3] == '0' then return {1, 0} end
  now_ms()
  local fence = now_us
  for i = 1, n do
    local last = tonumber(redis.call('GET', KEYS[4 * i - 2]))
    if last and last >= fence then fence = last + 1 end
  end
  local written = string.format('%.0f', fence)
  for i = 1, n do
    redis.call('SET', KEYS[4 * i - 2], written, 'PX', ARGV[3])
  end
  return {1, fence}
end
for i = 1, n do
  local lock = 4 * i - 3
  if ARGV[5] == '1' then
    if redis.call('ZADD', KEYS[lock + 3], now_ms() + timeout, member) == 1 then
      redis.call('RPUSH', KEYS[lock + 2], member)
    end
    redis.call('PEXPIRE', KEYS[lock + 2], timeout * 2)
    redis.call('PEXPIRE', KEYS[lock + 3], timeout * 2)
    if not heads[i] then heads[i] = member end
  end
  mark_at(lock, heads[i])
end
return {0, busy, busy_ttl}
