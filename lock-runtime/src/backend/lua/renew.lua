-- RENEW: extends each lock's expiry only if it still holds that lock's
-- token (with or without a wake mark). One call renews up to 100 locks of
-- one client, all on one Redis node.
--
-- KEYS[i] lock i. ARGV[2i-1] ttl_ms of lock i, ARGV[2i] token of lock i.
-- Replies one code per lock: 1 extended, 0 key gone (or a read/write lock's
-- writer key gone and then made the gate `q` of its waiters), -1 another
-- holder's token (left untouched).
local result = {}
for i, key in ipairs(KEYS) do
  local held = redis.call('GET', key)
  if held == ARGV[2 * i] or (held and string.sub(held, 1, #ARGV[2 * i] + 1) == ARGV[2 * i] .. '|') then
    redis.call('PEXPIRE', key, ARGV[2 * i - 1])
    result[i] = 1
  elseif held == false or held == 'q' then
    result[i] = 0
  else
    result[i] = -1
  end
end
return result
