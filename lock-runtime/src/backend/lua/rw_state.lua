-- Helpers of the read/write lock scripts (after shares.lua), about the
-- writer key KEYS[1], whose value is one of:
--   `<token>` or `kept:<token>`: a writer holds (kept: its hold_at_least);
--   `r:<token>`: a lone reader holds, one that entered with the plain
--     `SET <writer key> r:<token> NX PX <ttl>` (the uncontended read acquire:
--     one command, no script); it is a reader share like the ZSET's, with
--     its expiry the key's own, on the server clock;
--   `q`: the gate, set while waiters are queued and nobody holds the key,
--     so that the plain reader SET fails and readers come to the scripts,
--     which make them queue behind a waiting writer;
--   absent: nobody holds the key and nobody waits.
--
-- writer_holds(value), lone_reader(value): what the value says.
-- settle(): makes the gate exist exactly while the queue does (when the key
-- is free), with the queue's ttl.
-- wake(): drops waiters that stopped refreshing; then, if no writer holds:
-- tells a `w` head entry when no reader share is live, or every `r` entry
-- before the first `w` entry (ONE PUBLISH per channel). Returns whether it
-- told anybody.

local function lone_reader(value)
  return value and string.sub(value, 1, 2) == 'r:'
end

local function writer_holds(value)
  return value and value ~= 'q' and not lone_reader(value)
end

local function settle()
  local value = redis.call('GET', KEYS[1])
  local queue_ttl = redis.call('PTTL', KEYS[3])
  if queue_ttl == -2 then
    if value == 'q' then redis.call('DEL', KEYS[1]) end
  elseif value == false or value == 'q' then
    if queue_ttl < 0 then queue_ttl = 60000 end
    redis.call('SET', KEYS[1], 'q', 'PX', math.max(queue_ttl, 1))
  end
end

local function wake()
  local live = live_queue(KEYS[3], KEYS[4], false)
  if #live == 0 then return false end
  local value = redis.call('GET', KEYS[1])
  if writer_holds(value) then return false end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms())
  if string.sub(live[1], 1, 2) == 'w|' then
    if not lone_reader(value) and redis.call('EXISTS', KEYS[2]) == 0 then
      publish({live[1]})
      return true
    end
    return false
  end
  local readers = {}
  for _, queued in ipairs(live) do
    if string.sub(queued, 1, 2) == 'w|' then break end
    readers[#readers + 1] = queued
  end
  publish(readers)
  return #readers > 0
end
