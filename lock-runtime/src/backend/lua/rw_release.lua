-- rw_release: ends the caller's share of a read/write lock, then wakes the
-- queued waiters that may enter now.
--
-- KEYS = writer, readers, queue, deadlines, fence (as for rw_acquire; the
--        fence key is not used).
-- ARGV = mode (`r` or `w`), token,
--        keep_ms (writer only: 0 releases; > 0 is hold_at_least: the writer
--        value becomes `kept:<token>` with PX keep_ms instead of being
--        deleted, and nobody is woken; a kept writer key no longer answers to
--        the token, so a late renewal extends nothing).
-- Returns 2 released and woke a waiter (so that the releaser's next attempt
--         lets it go first), 1 released (or, with keep_ms > 0, already kept by an earlier
--         attempt of this release), 0 the share was gone or expired (lost;
--         for a writer, also when the key is the gate: it expired, then
--         waiters closed the gate), -1 the writer key holds another token
--         (left untouched).
--
-- A read release only deletes the writer key when it holds the caller's own
-- `r:<token>` (a lone reader); otherwise it only touches the readers key. An
-- unknown or expired share creates no key. A lone reader released while
-- nobody is queued is GET + EXISTS + DEL.
--
-- Wake (after a release that freed something): see wake() in rw_state.lua;
-- then settle(), after wake() has dropped dead waiters (with only dead
-- waiters left, no gate stays behind).
-- A read release that leaves live readers behind a queued writer wakes
-- nobody. The gate is then made to match the queue (settle).
--
-- Preceded by shares.lua and rw_state.lua.
-- When the ACL refused a message to a waiter, the reply is `{reply, <Redis's
-- error>}` instead (publish.lua's told()).

local token = ARGV[2]
local held = redis.call('GET', KEYS[1])
if ARGV[1] == 'w' then
  -- gone, or gone and then the gate of the waiters: expired, not taken over
  if held == false or held == 'q' then return 0 end
  local kept = 'kept:' .. token
  if held == kept then
    if tonumber(ARGV[3]) > 0 then return 1 end
    return 0
  end
  if held ~= token then return -1 end
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[1], kept, 'PX', ARGV[3])
    return 1
  end
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
  local woke = wake()
  settle()
  return told(woke and 2 or 1)
end

if held == 'r:' .. token then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
  local woke = wake()
  settle()
  return told(woke and 2 or 1)
end

local expiry = tonumber(redis.call('ZSCORE', KEYS[2], token))
if not expiry then return 0 end
redis.call('ZREM', KEYS[2], token)
if expiry <= now_ms() then return 0 end
if held ~= 'q' and redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
local woke = wake()
settle()
return told(woke and 2 or 1)
