-- QUORUM_SEMAPHORE_ACQUIRE: one node's part of an attempt over a quorum
-- (RedLock) for k permits of a semaphore of capacity N. The capacity is N
-- numbered slots; the attempt names the k slots it asks for, the same on
-- every node, and a node grants them only if every one is free here (or
-- held by an earlier attempt of the same caller). A holder thus holds the
-- same k slots on a majority, and one slot is never held by two holders
-- (two majorities share a node, which would have granted it twice): at
-- most N permits are held. A per-node count of permits with a majority
-- would not be enough (design §13). The line, deferring, not-after votes
-- and replacing are quorum_acquire.lua's. Preceded by publish.lua,
-- tickets.lua and quorum_shared.lua.
--
-- KEYS[1] permits (ZSET), KEYS[2] fence (unused), KEYS[3] tickets,
-- KEYS[4] waiters.
-- ARGV[1..10] as quorum_acquire.lua (ARGV[1] the attempt's value
-- `<token>|q<attempt>|s<slot>,<slot>,...`; ARGV[3] 0), ARGV[11] k,
-- ARGV[12] N.
-- Replies {1, 0, now} granted; {0, -3, 0, 0, now} too late; {0, hint,
-- ticket, first, used, now} refused: hint is -2 when k slots are free here
-- (another waiter is first, or the slots asked for are taken), else the ms
-- until the earliest holder here expires; `used` the slots held here by
-- others, comma-separated (the client asks for free ones next time);
-- {-3, stored N, now} held with another capacity; {-4, N, now} k > N.
local k, n, ttl = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[2])
local member = ARGV[11] .. '|' .. ARGV[1]
if ARGV[8] == '1' then
  local expiry = tonumber(redis.call('ZSCORE', KEYS[1], member))
  if expiry and expiry > now_ms() then return {1, 0, now_us} end
end
if ARGV[10] ~= '0' and now_us > tonumber(ARGV[10]) then return {0, -3, 0, 0, now_us} end
local members, used, capacity, count = permits()
if capacity and capacity ~= n then return {-3, capacity, now_us} end
if k > n then return {-4, n, now_us} end
local token, number, slots = permit_of(member)
if not token or #slots ~= k then return redis.error_reply('ERR quorum semaphore: malformed value') end
-- own earlier holds (given up, their give-back on its way) are replaced by
-- this attempt; a later one means this call lands late: nothing written
local earlier = {}
for _, held in ipairs(members) do
  local held_token, held_number, held_slots = permit_of(held)
  if held_token == token then
    if held_number > number then return {0, -3, 0, 0, now_us} end
    if held_number < number then
      earlier[#earlier + 1] = held
      count = count - #held_slots
      for _, slot in ipairs(held_slots) do used[slot] = nil end
    end
  end
end
local ticket = join_line()
local first = false
if redis.call('ZCARD', KEYS[3]) > 0 then first = first_in_line(now_ms) end
local free = true
for _, slot in ipairs(slots) do
  if slot < 0 or slot >= n then return redis.error_reply('ERR quorum semaphore: slot out of range') end
  if used[slot] then free = false end
end
if free and (ARGV[6] == '0' or not first or first == ARGV[7]) then
  for _, held in ipairs(earlier) do redis.call('ZREM', KEYS[1], held) end
  redis.call('ZADD', KEYS[1], now_ms() + ttl, member)
  if not capacity then redis.call('ZADD', KEYS[1], '+inf', '#capacity:' .. string.format('%.0f', n)) end
  expire_at_least(KEYS[1], ttl)
  return {1, 0, now_us}
end
local hint = -2
if n - count < k then
  local earliest = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
  hint = math.max(tonumber(earliest[2]) - now_ms(), 0)
end
local taken = {}
for slot in pairs(used) do taken[#taken + 1] = slot end
table.sort(taken)
local is_first = 0
if first == ARGV[7] then is_first = 1 end
return {0, hint, tonumber(ticket), is_first, table.concat(taken, ','), now_us}
