-- Helpers of the shared-holder kinds (read/write locks, semaphores), put in
-- front of their scripts: now_ms() (the server clock in ms, read once per
-- script), expire_at_least(key, ms), live_queue(queue, deadlines, own), and
-- publish(entries), which tells the waiters of queue entries `<anything>|<channel>|<token>` with ONE PUBLISH
-- per channel whose message is the space-separated tokens. Preceded by
-- publish.lua.

local now_us = false
local function now_ms()
  if not now_us then
    local now = redis.call('TIME')
    now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return math.floor(now_us / 1000)
end

-- sets key's ttl to ms unless it already has a longer one
local function expire_at_least(key, ms)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- the queue's live entries in order, and `own`'s position among them (false
-- when absent): entries whose waiter stopped refreshing its deadline are
-- dropped from both keys, never `own` (it is refreshing right now)
local function live_queue(queue, deadlines, own)
  local live, position = {}, false
  for _, queued in ipairs(redis.call('LRANGE', queue, '0', '-1')) do
    local deadline = tonumber(redis.call('ZSCORE', deadlines, queued))
    if queued == own or (deadline and deadline > now_ms()) then
      live[#live + 1] = queued
      if queued == own and not position then position = #live end
    else
      redis.call('LREM', queue, '0', queued)
      redis.call('ZREM', deadlines, queued)
    end
  end
  return live, position
end

-- `<mode or k>|<channel>|<token>` -> channel, token (false for a malformed entry)
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
    publish_to(channel, table.concat(tokens[channel], ' '))
  end
end

