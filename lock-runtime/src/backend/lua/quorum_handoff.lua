-- QUORUM_HANDOFF: one node's part of an in-process hand-off over a quorum
-- (design §13, "In-process hand-off"): if the lock holds the passing
-- holder's value exactly, gives it the next holder's value with that
-- holder's ttl. Quorum values carry no wake mark: whether waiters of other
-- clients stand in line is read from the line itself.
--
-- KEYS[1] lock, KEYS[2] tickets. ARGV[1] the passing holder's value,
-- ARGV[2] the next holder's value, ARGV[3] next ttl_ms.
-- Replies {1, queued} passed, or already passed by an earlier send of this
-- call (queued: 1 if anyone stands in line here); {0} the key was gone;
-- {-1} another holder's value is there (left untouched).
local held = redis.call('GET', KEYS[1])
if held == false then return {0} end
if held ~= ARGV[2] then
  if held ~= ARGV[1] then return {-1} end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return {1, redis.call('EXISTS', KEYS[2])}
