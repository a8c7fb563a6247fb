-- rw_leave: a waiter of a read/write lock gives up its place in the queue
-- (its wait ran out, an error, or it was cancelled), then the waiters that
-- may enter now are woken: a leaving queued writer may unblock the readers
-- queued behind it, a leaving head may make a writer first in line. The
-- gate goes with the last waiter (settle).
--
-- KEYS = writer, readers, queue, deadlines, fence (as for rw_acquire; the
--        fence key is not used).
-- ARGV = entry (`<mode>|<channel>|<token>`).
-- Returns 1.
--
-- Wake, as after rw_release: see wake() in rw_state.lua.
--
-- Preceded by shares.lua and rw_state.lua.
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).

redis.call('LREM', KEYS[3], '0', ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
wake()
settle()
return told(1)
