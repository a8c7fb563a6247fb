-- Helper of rw_release and rw_leave (after shares.lua): wake() drops
-- waiters that stopped refreshing; then, if there is no writer, tells a `w`
-- head entry when no reader share is live, or every `r` entry before the
-- first `w` entry.

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

