-- RELEASE, continued after publish.lua (see release.lua): the lock holds
-- the caller's token followed by a wake mark, or another holder's token.
local mine = #ARGV[1] + 1
if string.sub(held, 1, mine) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
local waiter = string.sub(held, mine + 1)
local bar = string.find(waiter, '|', 1, true)
if not bar then return 1 end
-- 2 only if a client listens on the waiter's channel
if publish_to(string.sub(waiter, 1, bar - 1), string.sub(waiter, bar + 1)) > 0 then return 2 end
return told(1)
