-- PEEK (`Lock::holder`): an exclusive lock's value and remaining time, read
-- together. Writes nothing. Needs only `get` and `pttl` (in the lock's own
-- ACL rule, unlike INSPECT's `zcount`).
--
-- KEYS[1] the lock key.
-- Replies {value or nil, PTTL in ms (-2: no key)}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
