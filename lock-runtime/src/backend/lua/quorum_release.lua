-- QUORUM_RELEASE: the release on one node of a quorum (RedLock). Deletes the
-- lock only if it holds the caller's token (alone, or followed by `|q<attempt>`,
-- the mark of the attempt that wrote it), then wakes the first live waiter
-- queued on this node: publishes its token on its client's channel. Quorum
-- values carry no wake mark (mark.lua leaves them alone), so the queue is
-- read here; the waiter stays queued until it takes the lock or leaves.
--
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] waiters. ARGV[1] token.
-- Preceded by publish.lua, mark.lua and prune.lua.
-- Replies 2 released and a queued waiter was sent the message (a client
-- listens on one node of the quorum, so most nodes' messages reach nobody:
-- what matters to the releaser is that a waiter was queued), 1 released
-- (nobody queued), 0 the key was gone,
-- -1 another holder's token is there (left untouched).
local held = redis.call('GET', KEYS[1])
if held == false then return 0 end
if held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
if redis.call('LLEN', KEYS[2]) == 0 then return 1 end
local now = redis.call('TIME')
local now_ms = math.floor(tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000)
local head = prune(2, 3, false, function() return now_ms end)
if not head then return 1 end
local bar = string.find(head, '|', 1, true)
if not bar then return 1 end
publish_to(string.sub(head, 1, bar - 1), string.sub(head, bar + 1))
return 2
