-- rw_leave: a waiter of a read/write lock gives up its place in the queue
-- (its wait ran out, an error, or it was cancelled), then the waiters that
-- may enter now are woken: a leaving queued writer may unblock the readers
-- queued behind it, a leaving head may make a writer first in line.
--
-- KEYS = writer, readers, queue, deadlines, fence (as for rw_acquire; the
--        fence key is not used).
-- ARGV = entry (`<mode>|<channel>|<token>`).
-- Returns 1.
--
-- Wake, as after rw_release: waiters that stopped refreshing are dropped;
-- then, if there is no writer: a `w` head entry is told when no reader share
-- is live; `r` head entries (all before the first `w`) are told with ONE
-- PUBLISH per channel of their space-separated tokens.

local now_us = false
local function now_ms()
  if not now_us then
    local now = redis.call('TIME')
    now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return math.floor(now_us / 1000)
end

-- `<mode>|<channel>|<token>` -> channel, token (false for a malformed entry)
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

local function wake()
  local live = {}
  for _, queued in ipairs(redis.call('LRANGE', KEYS[3], '0', '-1')) do
    local deadline = tonumber(redis.call('ZSCORE', KEYS[4], queued))
    if deadline and deadline > now_ms() then
      live[#live + 1] = queued
    else
      redis.call('LREM', KEYS[3], '0', queued)
      redis.call('ZREM', KEYS[4], queued)
    end
  end
  if #live == 0 or redis.call('EXISTS', KEYS[1]) == 1 then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms())
  if string.sub(live[1], 1, 2) == 'w|' then
    if redis.call('ZCARD', KEYS[2]) == 0 then publish({live[1]}) end
    return
  end
  local readers = {}
  for _, queued in ipairs(live) do
    if string.sub(queued, 1, 2) == 'w|' then break end
    readers[#readers + 1] = queued
  end
  publish(readers)
end

redis.call('LREM', KEYS[3], '0', ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
wake()
return 1
