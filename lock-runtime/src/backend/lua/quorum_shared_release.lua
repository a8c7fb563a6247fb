-- QUORUM_SHARED_RELEASE: on one node of a quorum (RedLock), the release of
-- a read share, a writer or a semaphore holder, or the give-back of a
-- failed attempt of one. Removes exactly the caller's own value (a writer:
-- the writer key if it holds the value, or an attempt of it; a share or a
-- holder: its member), creates nothing, then tells the first waiter in line
-- if it could enter now (unless that is `own`, the giver's own entry).
-- Preceded by publish.lua, tickets.lua and quorum_shared.lua.
--
-- KEYS[1] writer key or permits, KEYS[2] fence (unused), KEYS[3] tickets,
-- KEYS[4] waiters, KEYS[5] readers (a semaphore: its permits again).
-- ARGV[1] the hold's value, or a failed attempt's; ARGV[2] the caller's
-- own entry in line, or ''; ARGV[3] `w`, `r`, or k (a semaphore's permits).
-- Replies 2 released and a waiter told, 1 released, 0 gone (or expired:
-- an expired member is removed), -1 another writer's value (untouched).
-- With a refused publish, `{reply, <Redis's error>}` (publish.lua's told()).
local value, mode = ARGV[1], ARGV[3]
local found = 0
if mode == 'w' then
  local held = redis.call('GET', KEYS[1])
  if held then
    if held ~= value and string.sub(held, 1, #value + 1) ~= value .. '|' then return -1 end
    redis.call('DEL', KEYS[1])
    found = 1
  end
else
  local key, member = KEYS[5], value
  if mode ~= 'r' then key, member = KEYS[1], mode .. '|' .. value end
  local expiry = tonumber(redis.call('ZSCORE', key, member))
  if expiry then
    redis.call('ZREM', key, member)
    if expiry > now_ms() then found = 1 end
    if mode ~= 'r' then permits() end
  end
end
if found == 1 and wake_first(ARGV[2]) then return told(2) end
return told(found)
