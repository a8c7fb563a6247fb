-- semaphore_release: gives back the caller's permits of a semaphore, then
-- wakes the queued waiters whose permits now fit.
--
-- KEYS = permits, queue, deadlines (as for semaphore_acquire).
-- ARGV = token, k (the permits it took: the member is `<k>|<token>`),
--        fair (`0`: wake every waiter that fits, passing over those that do
--        not; anything else: stop at the first that does not fit).
-- Returns 2 released and woke a waiter (the releaser's next attempt lets it
--         go first), 1 released (and woke nobody), 0 the holder was expired (its member is
--         removed) or unknown (nothing is created: no key, no capacity
--         member).
--
-- Wake: waiters that stopped refreshing are dropped; then the queue is
-- walked from the head, adding up the k of its entries while used + those
-- fit in the stored capacity, and (fair) stops at the first entry that does
-- not fit, or (not fair) passes over it; the waiters that fit are told with ONE PUBLISH per channel whose
-- message is the space-separated tokens of its waiters. When nobody holds
-- any more, the key goes (capacity member included): the semaphore can be
-- reopened with another capacity.
--
-- Preceded by shares.lua and semaphore.lua.
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).

local member = ARGV[2] .. '|' .. ARGV[1]
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], member))
if not expiry then return 0 end
redis.call('ZREM', KEYS[1], member)
local n = capacity()
if expiry <= now_ms() then return 0 end
if wake(n, ARGV[3] ~= '0') then return told(2) end
return told(1)
