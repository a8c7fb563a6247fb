-- Helper of rw_release and rw_leave (after shares.lua): wake() drops
-- waiters that stopped refreshing; then, if there is no writer, tells a `w`
-- head entry when no reader share is live, or every `r` entry before the
-- first `w` entry.

local function wake()
  local live = live_queue(KEYS[3], KEYS[4], false)
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

