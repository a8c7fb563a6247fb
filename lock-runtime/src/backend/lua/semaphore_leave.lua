-- semaphore_leave: a waiter of a semaphore gives up its place in the queue
-- (its wait ran out, an error, or it was cancelled), then the waiters whose
-- permits now fit are woken (the leaver may have been the head that did not
-- fit, holding back those behind it).
--
-- KEYS = permits, queue, deadlines (as for semaphore_acquire).
-- ARGV = entry (`<k>|<channel>|<token>`), capacity N (used when no capacity
--        is stored: nobody holds), fair (as for semaphore_release).
-- Returns 1.
--
-- Wake, as after semaphore_release: dead waiters are dropped; the waiters
-- from the head whose permits fit, in order up to the first that does not,
-- are told with ONE PUBLISH per channel of their space-separated tokens.
--
-- Preceded by shares.lua and semaphore.lua.
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).

redis.call('LREM', KEYS[2], '0', ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
wake(capacity() or tonumber(ARGV[2]), ARGV[3] ~= '0')
return told(1)
