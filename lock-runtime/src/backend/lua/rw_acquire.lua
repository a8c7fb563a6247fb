-- rw_acquire: takes a share of a read/write lock (many readers or one
-- writer) if the caller may have it, with a fencing token when asked, in one
-- step; otherwise (when asked) joins or refreshes the caller's place in the
-- queue of waiters that releases wake.
--
-- KEYS = writer (string: a writer's token, a lone reader's `r:<token>` or
--        the gate `q`, see rw_state.lua; PX ttl),
--        readers (ZSET: reader token -> that share's expiry, ms, server clock),
--        queue (LIST of entries `<mode>|<channel>|<token>`),
--        deadlines (ZSET: queue entry -> ms by which its waiter must refresh),
--        fence (string counter).
-- ARGV = mode (`r` or `w`), token, ttl_ms,
--        fence_retention_ms (0: no fencing token; the fence key is untouched),
--        waiter_timeout_ms,
--        join (1: join or refresh the caller's place when not acquired),
--        fair (1: a writer only takes a free lock when the queue is empty or
--        the caller is first in it; 0: any free lock),
--        entry (the caller's queue entry: `<mode>|<channel>|<token>`),
--        mine (1: an earlier attempt with this token got no answer; if the
--        caller holds with this token, that attempt took it: say so).
-- Returns {1, fencing_token or 0} when acquired;
--         {1, fencing_token or 0, remaining_ms} when `mine` found the share
--         already held with this token (a writer's token is the counter,
--         which nobody can have moved since; a reader gets a new token, as
--         the one its lost answer carried is unknown);
--         {0, hint_ms} when not acquired: the ms until what blocks the
--         caller may end (the writer's PTTL; for a writer blocked by
--         readers, the latest live share's expiry - now), or -2 when blocked
--         by a queued writer or by the order of the queue.
--
-- A reader may enter iff no writer holds and no `w` entry is queued ahead
-- of the caller's own entry (anywhere in the queue when the caller is not
-- queued): a waiting writer stops new readers. A writer may enter iff no
-- writer holds, no reader share is live (a lone reader's or the ZSET's),
-- and (fair = 0, or the queue is empty, or the caller's entry is first).
-- Waiters that stopped refreshing their place (the whole queue, never the
-- caller's own entry) and expired reader shares are removed first. Readers
-- that enter here go to the ZSET (only the plain SET makes a lone reader);
-- the gate is then made to match the queue (settle).
--
-- Preceded by shares.lua and rw_state.lua.

local mode, token, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local timeout = tonumber(ARGV[5])
local entry = ARGV[8]

local function fence_now()
  if ARGV[4] == '0' then return 0 end
  now_ms()
  local fence = now_us
  local last = tonumber(redis.call('GET', KEYS[5]))
  if last and last >= fence then fence = last + 1 end
  redis.call('SET', KEYS[5], string.format('%.0f', fence), 'PX', ARGV[4])
  return fence
end

local function fence_held()
  if ARGV[4] == '0' then return 0 end
  return tonumber(redis.call('GET', KEYS[5])) or 0
end

if ARGV[9] == '1' then
  local held = redis.call('GET', KEYS[1])
  if mode == 'w' then
    if held == token then
      return {1, fence_held(), redis.call('PTTL', KEYS[1])}
    end
  elseif held == 'r:' .. token then
    return {1, fence_now(), redis.call('PTTL', KEYS[1])}
  else
    local expiry = tonumber(redis.call('ZSCORE', KEYS[2], token))
    if expiry and expiry > now_ms() then
      return {1, fence_now(), expiry - now_ms()}
    end
  end
end

-- Fast path (the uncontended case): nobody holds the writer key (no writer,
-- no lone reader, no gate) and nobody is queued. A reader enters; a writer
-- enters when no live share is left either.
if ARGV[9] ~= '1' and redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms())
  if mode == 'r' then
    redis.call('ZADD', KEYS[2], now_ms() + ttl, token)
    expire_at_least(KEYS[2], ttl)
    return {1, fence_now()}
  elseif redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
    return {1, fence_now()}
  end
end

-- the live queue, in order, without the waiters whose deadline passed
-- (except the caller's own entry: it is refreshing its place right now)
local live, position = live_queue(KEYS[3], KEYS[4], entry)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms())

local held = redis.call('GET', KEYS[1])
local may
local hint = -2
if writer_holds(held) then
  hint = redis.call('PTTL', KEYS[1])
  may = false
elseif mode == 'w' then
  local readers = redis.call('ZRANGE', KEYS[2], '-1', '-1', 'WITHSCORES')
  local last = -1
  -- (never -1: a lone reader's key always has a ttl; were it without, it
  -- would still block)
  if lone_reader(held) then last = math.max(redis.call('PTTL', KEYS[1]), 0) end
  if readers[1] then last = math.max(last, tonumber(readers[2]) - now_ms()) end
  if last >= 0 then
    hint = last
    may = false
  else
    may = ARGV[7] == '0' or #live == 0 or position == 1
  end
else
  may = true
  local ahead = #live
  if position then ahead = position - 1 end
  for i = 1, ahead do
    if string.sub(live[i], 1, 2) == 'w|' then
      may = false
      break
    end
  end
end

if may then
  if redis.call('ZREM', KEYS[4], entry) == 1 or position then
    redis.call('LREM', KEYS[3], '0', entry)
  end
  if mode == 'w' then
    redis.call('SET', KEYS[1], token, 'PX', ttl)
  else
    redis.call('ZADD', KEYS[2], now_ms() + ttl, token)
    expire_at_least(KEYS[2], ttl)
    settle()
  end
  return {1, fence_now()}
end

if ARGV[6] == '1' then
  redis.call('ZADD', KEYS[4], now_ms() + timeout, entry)
  if not position then redis.call('RPUSH', KEYS[3], entry) end
  expire_at_least(KEYS[3], timeout * 2)
  expire_at_least(KEYS[4], timeout * 2)
end
settle()
return {0, hint}
