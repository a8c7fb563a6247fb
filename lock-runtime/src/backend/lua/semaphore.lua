-- Helpers of the semaphore scripts (after shares.lua): permits(value), the k
-- of a member or entry; capacity(), the stored capacity, deleting the key
-- when nobody holds; wake(n, fair), which drops dead waiters and tells the
-- waiters whose permits fit in capacity n: from the head, in order, up to
-- the first that does not (fair), or every one that fits, passing over
-- those that do not (not fair: they may take permits ahead of the queue);
-- it returns whether it told anybody.

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

-- drops dead waiters, then tells the waiters whose permits fit in capacity
-- n: from the head, up to the first that does not fit (fair), or all that
-- fit (not fair)
local function wake(n, fair)
  local live = live_queue(KEYS[2], KEYS[3], false)
  if #live == 0 or not n then return false end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
  local used = 0
  for _, holder in ipairs(redis.call('ZRANGE', KEYS[1], '0', '-1')) do
    if string.sub(holder, 1, 1) ~= '#' then used = used + permits(holder) end
  end
  local woken = {}
  for _, queued in ipairs(live) do
    local k = permits(queued)
    if used + k <= n then
      used = used + k
      woken[#woken + 1] = queued
    elseif fair then
      break
    end
  end
  publish(woken)
  capacity()
  return #woken > 0
end

