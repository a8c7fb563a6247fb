-- QUORUM_RW_ACQUIRE: one node's part of an attempt over a quorum (RedLock)
-- for a read share or the write side of a read/write lock. The same rules
-- as quorum_acquire.lua (the line ordered by tickets, deferring to the
-- first waiter, not-after votes, a later attempt of the same caller
-- replacing an earlier one's grant, never the reverse), with the
-- read/write rule: a reader enters when no writer holds the writer key, a
-- writer when nobody holds it and no read share is live. Each read share
-- has its own expiry (its score). Preceded by publish.lua, tickets.lua and
-- quorum_shared.lua.
--
-- KEYS[1] writer key, KEYS[2] fence, KEYS[3] tickets, KEYS[4] waiters,
-- KEYS[5] readers.
-- ARGV[1..10] as quorum_acquire.lua (ARGV[1] the attempt's value
-- `<token>|q<attempt>`), ARGV[11] `r` (a read share) or `w` (the writer).
-- Replies as quorum_acquire.lua: {1, fence or 0, now} granted; {0, -3, 0,
-- 0, now} too late; {0, hint, ticket, first, now} refused, where hint is
-- the writer's remaining ttl, or (a writer behind read shares) the ms until
-- the earliest share expires, or -2 (free here, but another waiter is
-- first in line).
local value, mode, ttl = ARGV[1], ARGV[11], tonumber(ARGV[2])
if ARGV[8] == '1' then
  local found
  if mode == 'w' then
    found = redis.call('GET', KEYS[1]) == value
  else
    local expiry = tonumber(redis.call('ZSCORE', KEYS[5], value))
    found = expiry and expiry > now_ms()
  end
  if found then
    local fence = 0
    if ARGV[3] ~= '0' then
      -- a writer's token is still the last; a reader takes a new one (a
      -- later reader may carry the current one)
      if mode == 'w' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 else fence = next_fence() end
    end
    return {1, fence, now_us}
  end
end
if ARGV[10] ~= '0' and now_us > tonumber(ARGV[10]) then return {0, -3, 0, 0, now_us} end
local token, number = attempt_of(value)
-- Own earlier shares (given up, their give-back on its way) are replaced by
-- this attempt; a later one means this call lands late: nothing written.
local earlier = {}
if mode == 'r' and token then
  for _, share in ipairs(redis.call('ZRANGE', KEYS[5], '0', '-1')) do
    local share_token, share_number = attempt_of(share)
    if share_token == token then
      if share_number > number then return {0, -3, 0, 0, now_us} end
      if share_number < number then earlier[#earlier + 1] = share end
    end
  end
end
local ticket = join_line()
local first = false
if redis.call('ZCARD', KEYS[3]) > 0 then first = first_in_line(now_ms) end
local writer = redis.call('GET', KEYS[1])
if writer and mode == 'w' and token then
  local held_token, held_number = attempt_of(writer)
  if held_token == token and held_number < number then writer = false end
end
local readers = live_readers()
local hint = -2
if writer then
  hint = redis.call('PTTL', KEYS[1])
elseif mode == 'w' and readers > 0 then
  local earliest = redis.call('ZRANGE', KEYS[5], '0', '0', 'WITHSCORES')
  hint = math.max(tonumber(earliest[2]) - now_ms(), 0)
end
local may = not writer and (mode == 'r' or readers == 0)
if may and (ARGV[6] == '0' or not first or first == ARGV[7]) then
  if mode == 'w' then
    redis.call('SET', KEYS[1], value, 'PX', ttl)
  else
    for _, share in ipairs(earlier) do redis.call('ZREM', KEYS[5], share) end
    redis.call('ZADD', KEYS[5], now_ms() + ttl, value)
    expire_at_least(KEYS[5], ttl)
  end
  local fence = 0
  if ARGV[3] ~= '0' then fence = next_fence() end
  return {1, fence, now_us}
end
local is_first = 0
if first == ARGV[7] then is_first = 1 end
return {0, hint, tonumber(ticket), is_first, now_us}
