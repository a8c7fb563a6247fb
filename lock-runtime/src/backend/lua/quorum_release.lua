-- QUORUM_RELEASE: the release on one node of a quorum (RedLock), and the
-- give-back of a failed attempt. Deletes the lock only if it holds the
-- caller's value (the holder's token, or a failed attempt's exact
-- `<token>|q<attempt>`; the holder's token also matches any of its attempts'
-- values), then wakes the first live waiter in line on this node (the same
-- waiter on every node: tickets.lua). The waiter stays in line until it takes
-- the lock or leaves.
--
-- KEYS[1] lock, KEYS[2] fence (unused), KEYS[3] tickets, KEYS[4] waiters.
-- ARGV[1] token or attempt value, ARGV[2] the caller's own entry in line
-- (a failed attempt's give-back: its waiter is not woken by itself) or ''.
-- Put together as quorum_release.lua, publish.lua, tickets.lua,
-- quorum_release_wake.lua: the common case (nobody in line) returns before
-- the helpers are defined (a script defines its local functions anew on
-- every run, a closure each: with the helpers in front this release cost
-- Redis 3.4 µs, 1.6 µs without them).
-- Replies 2 released and a waiter in line was sent the message (a client may
-- not listen on every node: what matters to the releaser is that a waiter
-- was in line), 1 released (nobody in line), 0 the key was gone, -1 another
-- holder's value is there (left untouched).
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).
local held = redis.call('GET', KEYS[1])
if held == false then return 0 end
if held ~= ARGV[1] and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return -1 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
