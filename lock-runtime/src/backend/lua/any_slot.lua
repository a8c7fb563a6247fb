-- ANY SLOT: put (after the `#!lua flags=allow-cross-slot-keys` line) in
-- front of a renewal script run on a Redis Cluster primary for keys of
-- several of its slots. Redis checks that a script's declared keys share one
-- slot; the flag lets it touch others of the same node. So the call
-- declares one key (KEYS[1], which routes it) and passes them all in ARGV:
-- ARGV[1] the number of keys n, ARGV[2..n+1] the keys, then the script's own
-- arguments. KEYS and ARGV are rebound here as the script after expects.
local KEYS, ARGV = (function(argv)
  local n = tonumber(argv[1])
  local keys, args = {}, {}
  for i = 1, n do keys[i] = argv[1 + i] end
  for i = n + 2, #argv do args[#args + 1] = argv[i] end
  return keys, args
end)(ARGV)
