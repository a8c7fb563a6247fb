-- QUORUM_RELEASE, continued after publish.lua and tickets.lua (see
-- quorum_release.lua): the lock is deleted and waiters are in line; wake the
-- first live one, unless it is the caller's own entry.
local now = redis.call('TIME')
local now_ms = math.floor(tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000)
local first = first_in_line(function() return now_ms end)
if not first or first == ARGV[2] then return 1 end
wake(first)
return told(2)
