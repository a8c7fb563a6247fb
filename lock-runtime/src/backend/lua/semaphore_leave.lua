-- semaphore_leave: a waiter of a semaphore gives up its place in the queue
-- (its wait ran out, an error, or it was cancelled), then the waiters whose
-- permits now fit are woken (the leaver may have been the head that did not
-- fit, holding back those behind it).
--
-- KEYS = permits, queue, deadlines (as for semaphore_acquire).
-- ARGV = entry (`<k>|<channel>|<token>`), capacity N (used when no capacity
--        is stored: nobody holds).
-- Returns 1.
--
-- Wake, as after semaphore_release: dead waiters are dropped; the waiters
-- from the head whose permits fit, in order up to the first that does not,
-- are told with ONE PUBLISH per channel of their space-separated tokens.

local now_us = false
local function now_ms()
  if not now_us then
    local now = redis.call('TIME')
    now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return math.floor(now_us / 1000)
end

-- the k of a member `<k>|<token>` or an entry `<k>|<channel>|<token>`
local function permits(value)
  local bar = string.find(value, '|', 1, true)
  if not bar then return 0 end
  return tonumber(string.sub(value, 1, bar - 1)) or 0
end

-- the stored capacity (false if none), deleting the key when nobody holds
local function capacity()
  local held = redis.call('ZRANGE', KEYS[1], '0', '-1')
  local stored = false
  for _, holder in ipairs(held) do
    if string.sub(holder, 1, 10) == '#capacity:' then stored = tonumber(string.sub(holder, 11)) end
  end
  if stored and #held == 1 then redis.call('DEL', KEYS[1]) end
  return stored
end

-- `<k>|<channel>|<token>` -> channel, token (false for a malformed entry)
local function split(entry)
  local a = string.find(entry, '|', 1, true)
  if not a then return false end
  local b = string.find(entry, '|', a + 1, true)
  if not b then return false end
  return string.sub(entry, a + 1, b - 1), string.sub(entry, b + 1)
end

-- one PUBLISH per channel: the space-separated tokens of its entries
local function publish(entries)
  local channels, tokens = {}, {}
  for _, entry in ipairs(entries) do
    local channel, token = split(entry)
    if channel then
      if not tokens[channel] then
        channels[#channels + 1] = channel
        tokens[channel] = {}
      end
      table.insert(tokens[channel], token)
    end
  end
  for _, channel in ipairs(channels) do
    redis.call('PUBLISH', channel, table.concat(tokens[channel], ' '))
  end
end

-- drops dead waiters, then tells the waiters from the head of the queue
-- whose permits fit in capacity n, in order, up to the first that does not
local function wake(n)
  local live = {}
  for _, queued in ipairs(redis.call('LRANGE', KEYS[2], '0', '-1')) do
    local deadline = tonumber(redis.call('ZSCORE', KEYS[3], queued))
    if deadline and deadline > now_ms() then
      live[#live + 1] = queued
    else
      redis.call('LREM', KEYS[2], '0', queued)
      redis.call('ZREM', KEYS[3], queued)
    end
  end
  if #live == 0 or not n then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
  local used = 0
  for _, holder in ipairs(redis.call('ZRANGE', KEYS[1], '0', '-1')) do
    if string.sub(holder, 1, 1) ~= '#' then used = used + permits(holder) end
  end
  local woken = {}
  for _, queued in ipairs(live) do
    used = used + permits(queued)
    if used > n then break end
    woken[#woken + 1] = queued
  end
  publish(woken)
  capacity()
end

redis.call('LREM', KEYS[2], '0', ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
wake(capacity() or tonumber(ARGV[2]))
return 1
