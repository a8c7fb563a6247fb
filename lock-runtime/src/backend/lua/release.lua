-- RELEASE: deletes the lock only if it holds the caller's token and, if its
-- wake mark names a waiter, publishes that waiter's token on its client's
-- channel.
--
-- KEYS[1] lock. ARGV[1] token.
-- Preceded by publish.lua.
-- Replies 2 released and the message was received by the waiter's client,
-- 1 released (nobody to wake, or nobody listening; `{1, <error>}` when the
-- ACL refused the message: publish.lua's told()), 0 the key was gone
-- (expired), -1 another holder's token is there (left untouched).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == false then return 0 end
local mine = #ARGV[1] + 1
if string.sub(held, 1, mine) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
local waiter = string.sub(held, mine + 1)
local bar = string.find(waiter, '|', 1, true)
if not bar then return 1 end
-- 2 only if a client listens on the waiter's channel
if publish_to(string.sub(waiter, 1, bar - 1), string.sub(waiter, bar + 1)) > 0 then return 2 end
return told(1)
