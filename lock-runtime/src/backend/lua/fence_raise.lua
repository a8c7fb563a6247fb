-- FENCE RAISE: over a quorum, the write-back of a fencing token: makes the
-- node's last token at least the one an acquisition took from the highest
-- of its majority's, so that every later majority (which shares a node
-- with this one) hands out a larger one.
--
-- KEYS[1] fence. ARGV[1] token, ARGV[2] retention in ms.
-- Replies 1.
local last = tonumber(redis.call('GET', KEYS[1])) or 0
if last < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
