-- renew_shares: renews many shares of one client in one call (read/write
-- lock reader shares, semaphore permits): each a member of a ZSET whose
-- score is the share's expiry in ms on the server clock, or (a read share
-- taken by the plain SET) a lone reader's writer key `r:<token>`.
--
-- KEYS = each share's keys, in order: the ZSET key (a permit), or the
--        writer key then the readers ZSET key (a read share). Keys may
--        repeat.
-- ARGV = member_1, ttl_ms_1, keys_1 (1 or 2: how many KEYS the share has),
--        member_2, ttl_ms_2, keys_2, ...
-- Returns one code a share: 1 renewed (score now + ttl, and the key's ttl
--         made at least ttl, never shortened: other shares may last longer;
--         a lone reader's key: PEXPIRE ttl), 0 lost: the member was expired
--         (it is removed) or absent (nothing is created).
--
-- A renewal touches only the caller's own members: a dead holder's share is
-- never kept alive by another's renewal. A semaphore key left with nothing
-- but its capacity member (nobody holds) is deleted.
--
-- Preceded by shares.lua.

local result = {}
local k = 1
for i = 1, #ARGV / 3 do
  local member, ttl = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1])
  local key = KEYS[k]
  local lone = false
  if ARGV[3 * i] == '2' then
    lone = redis.call('GET', KEYS[k]) == 'r:' .. member
    key = KEYS[k + 1]
    k = k + 2
  else
    k = k + 1
  end
  if lone then
    redis.call('PEXPIRE', KEYS[k - 2], ttl)
    result[i] = 1
  else
    local expiry = tonumber(redis.call('ZSCORE', key, member))
    if expiry and expiry > now_ms() then
      redis.call('ZADD', key, 'XX', now_ms() + ttl, member)
      local left = redis.call('PTTL', key)
      if left == -1 or (left >= 0 and left < ttl) then redis.call('PEXPIRE', key, ttl) end
      result[i] = 1
    else
      if expiry then
        redis.call('ZREM', key, member)
        if redis.call('ZCARD', key) == 1 then
          local only = redis.call('ZRANGE', key, '0', '0')[1]
          if string.sub(only, 1, 10) == '#capacity:' then redis.call('DEL', key) end
        end
      end
      result[i] = 0
    end
  end
end
return result
