-- RELEASE_KEEPING (hold_at_least): instead of deleting the lock, keeps it
-- for keep_ms more, if it holds the caller's token. The kept value is
-- `kept:<token>`, which no renewal or release of this holder matches any
-- more. Wakes nobody: waiters sleep at most until the key's expiry.
--
-- KEYS[1] lock. ARGV[1] token, ARGV[2] keep_ms.
-- Replies 1 kept (or already kept by an earlier attempt of this release),
-- 0 the key was gone, -1 another holder's token is there.
local held = redis.call('GET', KEYS[1])
if held == false then return 0 end
local kept = 'kept:' .. ARGV[1]
if held == kept or string.sub(held, 1, #kept + 1) == kept .. '|' then return 1 end
if held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('SET', KEYS[1], kept, 'PX', ARGV[2])
return 1
