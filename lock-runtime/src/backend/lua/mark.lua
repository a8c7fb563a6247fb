-- Helper, included by scripts that change the head of a lock's queue.
-- mark(head): makes the held lock's wake mark (KEYS[1], the lock key) name
-- `head` (a queue entry `<channel>|<token>`), or removes the mark when head is
-- false; keeps the holder's token and the key's ttl. Does nothing when the
-- lock is free, or held by a quorum (RedLock) attempt: its value
-- `<token>|q<attempt>` carries no wake mark, and its give-back deletes only
-- that exact value.
local function mark(head)
  local held = redis.call('GET', KEYS[1])
  if not held then return end
  local owner = held
  local bar = string.find(held, '|', 1, true)
  if bar and string.sub(held, bar + 1, bar + 1) == 'q' then return end
  if bar then owner = string.sub(held, 1, bar - 1) end
  local wanted = owner
  if head then wanted = owner .. '|' .. head end
  if wanted ~= held then redis.call('SET', KEYS[1], wanted, 'KEEPTTL') end
end
