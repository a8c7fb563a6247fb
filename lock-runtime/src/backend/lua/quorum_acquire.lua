-- QUORUM_ACQUIRE: one node's part of an attempt over a quorum (RedLock).
-- Takes the lock if it is free (or held by an earlier, given-up attempt of
-- the same caller) and nobody queued here is ahead of the caller; a waiter first joins (or refreshes) its place in the line, ordered
-- by its ticket (tickets.lua), and keeps it even when granted here (it
-- leaves once its attempt held on a majority; a set's waiter, once it holds
-- every key of its set: lease/set_by_key.rs). The value written is the attempt's own
-- (`<token>|q<attempt>`): quorum values carry no wake mark, and a failed
-- attempt's give-back deletes exactly that value. Preceded by publish.lua and
-- tickets.lua.
--
-- KEYS[1] lock, KEYS[2] fence, KEYS[3] tickets, KEYS[4] waiters
-- ARGV[1] the attempt's value, ARGV[2] ttl_ms, ARGV[3] fence_retention_ms (0:
-- no fencing token), ARGV[4] waiter_timeout_ms, ARGV[5] join (1: join or
-- refresh the line when not acquired), ARGV[6] respect (0: take a free lock;
-- 1: only when the first live waiter in line that is not a set's is the
-- caller, or there is none: a set's place, its entry ending in `*`, keeps
-- no key, design §16; 2: only when the caller is first in line, or nobody
-- is: the releaser's next attempt lets every waiter go first), ARGV[7] the caller's
-- entry, ARGV[8] mine (1: an earlier try of this same call got no answer; if
-- the lock holds the value, say so), ARGV[9] the caller's ticket (0: none yet,
-- this node's clock in µs is used and returned), ARGV[10] not after (µs on
-- this node's clock, 0: no limit): a call that arrives later (it waited in a
-- connection, or behind this node while it was stopped) is refused with
-- nothing written: its caller no longer waits for the answer, and a grant
-- would hold this node for a whole ttl for nobody.
-- Replies {1, fence or 0, now} acquired (or found already taken with this
-- value: mine); {0, -3, 0, 0, now} too late; {0, pttl, ticket, first, now}
-- not acquired: the holder's
-- remaining ttl in ms (-2: free, but another waiter is first in line), the
-- ticket the caller is queued with here (0: not queued), 1 if the caller is
-- first in line here. `now`: this node's clock in µs (the client keeps the
-- quorum's time from it, for its waiters' tickets).
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local function now_ms() return math.floor(now_us / 1000) end
if ARGV[8] == '1' and redis.call('GET', KEYS[1]) == ARGV[1] then
  local fence = 0
  if ARGV[3] ~= '0' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 end
  return {1, fence, now_us}
end
if ARGV[10] ~= '0' and now_us > tonumber(ARGV[10]) then return {0, -3, 0, 0, now_us} end
local member = ARGV[7]
local ticket = '0'
if ARGV[5] == '1' then
  ticket = ARGV[9]
  if ticket == '0' then ticket = string.format('%.0f', now_us) end
  local timeout = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], ticket, member)
  redis.call('ZADD', KEYS[4], now_ms() + timeout, member)
  -- The line outlives its longest place (never shortened by a waiter with a
  -- shorter timeout).
  for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < timeout * 2 then redis.call('PEXPIRE', KEYS[i], timeout * 2) end
  end
end
local first = false
if redis.call('ZCARD', KEYS[3]) > 0 then first = first_in_line(now_ms) end
-- The waiter a free lock is left to: the first live one that is not a
-- set's, or the caller if it comes first (a set's place keeps no key).
local ahead = first
if first and first ~= member and string.sub(first, -1) == '*' then
  ahead = false
  for _, entry in ipairs(redis.call('ZRANGE', KEYS[3], '0', '-1')) do
    local deadline = tonumber(redis.call('ZSCORE', KEYS[4], entry))
    if entry == member or (string.sub(entry, -1) ~= '*' and deadline and deadline > now_ms()) then
      ahead = entry
      break
    end
  end
end
if ARGV[6] == '2' then ahead = first end
-- Free, or held by an earlier attempt of this same caller (given up, its
-- give-back still on its way; never a later one, which this call, landing
-- late, must not undo): a value is `<token>|q<attempt number, 8 hex digits>`.
local held = redis.call('GET', KEYS[1])
if held then
  local token, number = string.match(ARGV[1], '^(.*)|q(%x+)$')
  local held_token, held_number = string.match(held, '^(.*)|q(%x+)$')
  if token and held_token == token and tonumber(held_number, 16) < tonumber(number, 16) then
    held = false
  end
end
if not held and (ARGV[6] == '0' or not ahead or ahead == member) then
  -- A waiter stays in line until the attempt is known to hold: a failed
  -- attempt keeps its place on every node, and a winner leaves every node's
  -- line (quorum_leave.lua).
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if ARGV[3] == '0' then return {1, 0, now_us} end
  local fence = now_us
  local last = tonumber(redis.call('GET', KEYS[2]))
  if last and last >= fence then fence = last + 1 end
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  return {1, fence, now_us}
end
local is_first = 0
if ahead == member then is_first = 1 end
local pttl = -2
if held then pttl = redis.call('PTTL', KEYS[1]) end
return {0, pttl, tonumber(ticket), is_first, now_us}
