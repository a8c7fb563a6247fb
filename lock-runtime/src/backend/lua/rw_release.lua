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
-- Returns 1 released (or, with keep_ms > 0, already kept by an earlier
--         attempt of this release), 0 the share was gone or expired (lost),
--         -1 the writer key holds another token (left untouched).
--
-- A read release only ever touches the readers key (never the writer key),
-- and an unknown or expired share creates no key.
--
-- Wake (after a release that freed something): waiters that stopped
-- refreshing are dropped from the queue; then, if there is no writer:
-- when the head entry is `w` and no reader share is live, that writer's
-- token is published on its channel; when the head entries are `r`, every
-- `r` entry before the first `w` entry is told (they may enter, live
-- readers or not), with ONE PUBLISH per channel whose message is the
-- space-separated tokens of its readers. (A read release that leaves live
-- readers behind a queued writer wakes nobody.)
--
-- Preceded by shares.lua and rw_wake.lua.

local token = ARGV[2]
if ARGV[1] == 'w' then
  local held = redis.call('GET', KEYS[1])
  if held == false then return 0 end
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
  wake()
  return 1
end

local expiry = tonumber(redis.call('ZSCORE', KEYS[2], token))
if not expiry then return 0 end
redis.call('ZREM', KEYS[2], token)
if expiry <= now_ms() then return 0 end
wake()
return 1
