-- RECORD (the client's holder record, docs/design.md §1): one client's
-- identity and its holds, in a hash that lockctl reads to name the process
-- behind a token. Written in the background, never by an acquisition.
--
-- KEYS[1] the record, `<prefix>client:{<client id>}`
-- ARGV[1] its ttl in ms
-- ARGV[2] '1': replace the record (delete it first), '0': update it
-- ARGV[3] n, the number of fields to set; ARGV[4 .. 3 + 2n] field, value
-- pairs; the arguments after them: fields to delete.
-- With no field to set, the record is deleted (the client holds nothing).
-- Replies 1 if the record existed before this call, else 0.
local existed = redis.call('EXISTS', KEYS[1])
local n = tonumber(ARGV[3])
if n == 0 or ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
end
if n == 0 then
  return existed
end
-- In slices: `unpack` of thousands of arguments would overflow Lua's stack.
local last = 3 + 2 * n
local i = 4
while i <= last do
  local slice = {}
  for j = i, math.min(i + 199, last) do
    slice[#slice + 1] = ARGV[j]
  end
  redis.call('HSET', KEYS[1], unpack(slice))
  i = i + 200
end
i = last + 1
while i <= #ARGV do
  local slice = {}
  for j = i, math.min(i + 99, #ARGV) do
    slice[#slice + 1] = ARGV[j]
  end
  redis.call('HDEL', KEYS[1], unpack(slice))
  i = i + 100
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return existed
