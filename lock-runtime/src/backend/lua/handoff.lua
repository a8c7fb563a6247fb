-- HANDOFF: passes a held lock from one holder of a process to the next (the
-- in-process hand-off): if the lock holds the caller's token (with or without
-- a wake mark), gives it the next holder's token with that holder's ttl,
-- keeping the mark, and a new fencing token when asked.
--
-- KEYS[1] lock, KEYS[2] fence. ARGV[1] token, ARGV[2] next token,
-- ARGV[3] next ttl_ms, ARGV[4] fence_retention_ms (0: no fencing token).
-- Replies {1, fence or 0, queued} passed (queued: 1 if waiters of other
-- clients are queued, as the wake mark shows), or already passed by an
-- earlier attempt of this call; {0} the key was gone; {-1} another holder's
-- token is there.
local held = redis.call('GET', KEYS[1])
if held == false then return {0} end
local function starts(value, token)
  return value == token or string.sub(value, 1, #token + 1) == token .. '|'
end
if starts(held, ARGV[2]) then
  -- sent again after an attempt whose answer was lost: already passed
  local fence = 0
  if ARGV[4] ~= '0' then fence = tonumber(redis.call('GET', KEYS[2])) or 0 end
  local queued = 0
  if held ~= ARGV[2] then queued = 1 end
  return {1, fence, queued}
end
local mark = ''
if held ~= ARGV[1] then
  if string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return {-1} end
  mark = string.sub(held, #ARGV[1] + 1)
end
redis.call('SET', KEYS[1], ARGV[2] .. mark, 'PX', ARGV[3])
local queued = 0
if mark ~= '' then queued = 1 end
if ARGV[4] == '0' then return {1, 0, queued} end
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]))
if last and last >= fence then fence = last + 1 end
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[4])
return {1, fence, queued}
