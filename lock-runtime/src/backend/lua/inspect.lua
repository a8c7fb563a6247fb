-- INSPECT (lockctl, `Client::lock_info`, `Client::inspect`): a snapshot of
-- the three locks of one name (the exclusive lock, the read/write lock and
-- the semaphore: separate keys, one hash tag, so one slot), read in one
-- script so that it is consistent. Writes nothing, wakes nobody.
--
-- KEYS[1..3] lock, lock:fence, lock:waiters
-- KEYS[4..7] rw, rw:readers, rw:waiters, rw:fence
-- KEYS[8..9] sem, sem:waiters
-- Replies {now_ms,
--   {lock value or nil, lock PTTL, fence or nil, live waiters},
--   {rw value or nil, rw PTTL, {reader, expiry_ms, ...}, fence or nil,
--    live waiters},
--   {sem PTTL, {member, expiry_ms, ...}, live waiters}}
-- A live waiter is one whose refresh deadline (its score in the waiters
-- key) has not passed; dead ones are left for the lock's own scripts to
-- prune (the queue keys themselves are not read). Expiries are on the
-- server clock (now_ms).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function live(waiters)
  return redis.call('ZCOUNT', waiters, '(' .. now, '+inf')
end
local exclusive = {
  redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  live(KEYS[3])
}
local rw = {
  redis.call('GET', KEYS[4]), redis.call('PTTL', KEYS[4]),
  redis.call('ZRANGE', KEYS[5], '0', '-1', 'WITHSCORES'), redis.call('GET', KEYS[7]),
  live(KEYS[6])
}
local sem = {
  redis.call('PTTL', KEYS[8]), redis.call('ZRANGE', KEYS[8], '0', '-1', 'WITHSCORES'),
  live(KEYS[9])
}
return {now, exclusive, rw, sem}
