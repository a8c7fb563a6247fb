-- Helpers of the quorum (RedLock) scripts of read/write locks and
-- semaphores, put after publish.lua and tickets.lua. The line of waiters is
-- the exclusive lock's (tickets.lua: KEYS[3] tickets, KEYS[4] waiters),
-- with entries `<r|w|k>|<channel>|<token>`. KEYS[1] is the writer key (a
-- read/write lock) or the permits ZSET (a semaphore); KEYS[5] the readers
-- ZSET (read/write lock only).
--
-- A read share is the member `<token>|q<attempt>` of the readers ZSET,
-- scored with its expiry (ms, this node's clock); a writer the writer key
-- `<token>|q<attempt>` with its PX ttl; a semaphore holder the member
-- `<k>|<token>|q<attempt>|s<slot>,<slot>,...` of the permits ZSET, scored
-- with its expiry, beside `#capacity:<N>` (+inf) while anybody holds. A
-- semaphore's capacity is N numbered slots; a holder holds k named slots,
-- the same on every node it was granted on (design §13, "Semaphores over a
-- quorum").
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local function now_ms() return math.floor(now_us / 1000) end

-- `<token>|q<n>` -> token, n (false when not an attempt's value)
local function attempt_of(value)
  local token, number = string.match(value, '^(.*)|q(%x+)$')
  if token then return token, tonumber(number, 16) end
  return false, false
end

-- `<k>|<token>|q<n>|s<slots>` -> token, n, {slot, ...} (false otherwise)
local function permit_of(member)
  local token, number, slots = string.match(member, '^%d+|(.*)|q(%x+)|s([%d,]+)$')
  if not token then return false, false, false end
  local list = {}
  for slot in string.gmatch(slots, '%d+') do list[#list + 1] = tonumber(slot) end
  return token, tonumber(number, 16), list
end

-- sets key's ttl to ms unless it already has a longer one
local function expire_at_least(key, ms)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ms) then redis.call('PEXPIRE', key, ms) end
end

-- the live read shares (expired ones are dropped first)
local function live_readers()
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_ms())
  return redis.call('ZCARD', KEYS[5])
end

-- a semaphore's live holders (expired ones dropped first): their members,
-- slot -> member, the stored capacity (false: none), the slots in use
local function permits()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
  local members, used, capacity, count = {}, {}, false, 0
  for _, member in ipairs(redis.call('ZRANGE', KEYS[1], '0', '-1')) do
    if string.sub(member, 1, 10) == '#capacity:' then
      capacity = tonumber(string.sub(member, 11))
    else
      members[#members + 1] = member
      local _, _, slots = permit_of(member)
      for _, slot in ipairs(slots or {}) do
        used[slot] = member
        count = count + 1
      end
    end
  end
  if capacity and #members == 0 then
    -- nobody holds: the capacity is free to change
    redis.call('DEL', KEYS[1])
    capacity = false
  end
  return members, used, capacity, count
end

-- joins (or refreshes) the caller's place in line when asked (ARGV[5]),
-- with its ticket (ARGV[9]; 0: this node's clock); returns the ticket
local function join_line()
  if ARGV[5] ~= '1' then return '0' end
  local ticket = ARGV[9]
  if ticket == '0' then ticket = string.format('%.0f', now_us) end
  local timeout = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], ticket, ARGV[7])
  redis.call('ZADD', KEYS[4], now_ms() + timeout, ARGV[7])
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < timeout * 2 then redis.call('PEXPIRE', KEYS[i], timeout * 2) end
  end
  return ticket
end

-- whether the waiter of `entry` could enter now on this node
local function may_enter(entry)
  local mode = string.match(entry, '^([^|]*)|')
  if mode == 'r' then return redis.call('EXISTS', KEYS[1]) == 0 end
  if mode == 'w' then return redis.call('EXISTS', KEYS[1]) == 0 and live_readers() == 0 end
  local k = tonumber(mode)
  if not k then return false end
  local _, _, capacity, count = permits()
  return not capacity or capacity - count >= k
end

-- tells the first live waiter in line (unless it is `own`) when it could
-- enter now; true if told
local function wake_first(own)
  if redis.call('ZCARD', KEYS[3]) == 0 then return false end
  local first = first_in_line(now_ms)
  if not first or first == own or not may_enter(first) then return false end
  local channel, token = string.match(first, '^[^|]*|([^|]*)|(.*)$')
  if not channel then return false end
  publish_to(channel, token)
  return true
end

-- a new fencing token on this node (its clock in µs, or its last + 1)
local function next_fence()
  local fence = now_us
  local last = tonumber(redis.call('GET', KEYS[2]))
  if last and last >= fence then fence = last + 1 end
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  return fence
end
