-- Helper, included by scripts that read a lock's queue.
-- prune(q, w, stop, now_ms): drops waiters that stopped refreshing their place
-- from the head of the queue KEYS[q] (refresh deadlines in the sorted set
-- KEYS[w]), up to `stop` (an entry never dropped, or false); returns the new
-- head entry or false. now_ms() is the server clock in ms.
local function prune(q, w, stop, now_ms)
  local head = redis.call('LINDEX', KEYS[q], '0')
  while head and head ~= stop do
    local expiry = tonumber(redis.call('ZSCORE', KEYS[w], head))
    if expiry and expiry > now_ms() then break end
    redis.call('LPOP', KEYS[q])
    redis.call('ZREM', KEYS[w], head)
    head = redis.call('LINDEX', KEYS[q], '0')
  end
  return head
end
