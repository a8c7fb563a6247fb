-- The scripting environment of Redis 7.0, rebuilt over a stock Lua 5.1
-- (Redis patches its Lua to make tables read-only; here read-only proxies
-- stand in for them). Run once per Lua state, before any script; returns
-- the functions the Rust side calls. Its chunk name, `=sim_redis`, lets
-- the error handler skip its frames, as Redis's skips its C functions.
local sha1, random, randomseed = ...
local raw_error, raw_type, raw_tostring = error, type, tostring
local raw_rawset, raw_setmetatable, raw_pcall = rawset, setmetatable, pcall
local raw_select, raw_unpack, raw_setfenv, raw_loadstring, raw_load = select, unpack, setfenv, loadstring, load
local raw_find, raw_sub = string.find, string.sub
local dbg = debug
debug = nil
-- Not in Redis's globals.
print, dofile, loadfile, module, require, package, os, io = nil, nil, nil, nil, nil, nil, nil, nil

local G = _G
local READONLY = 'Attempt to modify a readonly table'
local protected = {}

local function readonly(t)
  local proxy = {}
  protected[proxy] = true
  raw_setmetatable(proxy, {
    __index = t,
    __newindex = function() raw_error(READONLY, 2) end,
    __metatable = false,
  })
  return proxy
end

-- redis.error_reply's and the command errors' table: `-CODE msg` or `msg`
-- (code ERR), without line breaks at either end.
local function error_table(text)
  local code, msg = 'ERR', text
  if raw_sub(text, 1, 1) == '-' then
    local space = raw_find(text, ' ', 1, true)
    if space then
      code, msg = raw_sub(text, 2, space - 1), raw_sub(text, space + 1)
    else
      msg = raw_sub(text, 2)
    end
  end
  msg = string.gsub(msg, '^[\r\n]+', '')
  msg = string.gsub(msg, '[\r\n]+$', '')
  return {err = code .. ' ' .. msg}
end

-- redis.call and redis.pcall are Rust functions (C functions, as in
-- Redis: a `return redis.call(...)` is no tail call, so the script's line
-- stays on the stack for the error handler), set for the time of a run.
-- redis.call raises its error table through `pending`: the Rust side
-- leaves the table there and raises an error of its own, which the error
-- handler and pcall replace with the table.
local pending = false
local function set_pending(t) pending = t end
local function take_pending()
  local p = pending
  pending = false
  return p
end
local function outside()
  raw_error(error_table('redis.call/pcall can only be called inside a script invocation'))
end
local redis = {}
redis.call, redis.pcall = outside, outside
redis.sha1hex = function(...)
  if raw_select('#', ...) ~= 1 then raw_error(error_table('wrong number of arguments')) end
  return sha1((...))
end
redis.error_reply = function(...)
  local text = ...
  if raw_select('#', ...) ~= 1 or raw_type(text) ~= 'string' then
    return error_table('wrong number or type of arguments')
  end
  if raw_sub(text, 1, 1) ~= '-' then text = '-' .. text end
  return error_table(text)
end
redis.status_reply = function(...)
  local text = ...
  if raw_select('#', ...) ~= 1 or raw_type(text) ~= 'string' then
    return error_table('wrong number or type of arguments')
  end
  return {ok = text}
end
redis.log = function(...)
  if raw_select('#', ...) < 2 then raw_error(error_table('redis.log() requires two arguments or more.')) end
end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
redis.REDIS_VERSION, redis.REDIS_VERSION_NUM = '7.0.15', 0x07000f
redis.setresp = function(resp)
  if resp ~= 2 then raw_error(error_table('RESP3 replies inside scripts are not modelled by sim-redis')) end
end
redis.set_repl = function() end
redis.replicate_commands = function() return true end
redis.breakpoint = function() return false end
redis.debug = function() end
redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL = 0, 1, 2, 2, 3

-- Redis's own `pcall`: an error raised as a table {err=...} comes back as
-- its message.
G.pcall = function(f, ...)
  local results = {raw_pcall(f, ...)}
  if not results[1] then
    local e = results[2]
    if raw_type(e) == 'userdata' then
      e = take_pending() or e
      results[2] = e
    end
    if raw_type(e) == 'table' and (raw_type(e.err) == 'string' or raw_type(e.err) == 'number') then
      results[2] = e.err
    end
  end
  return raw_unpack(results, 1, table.maxn(results))
end

math.random, math.randomseed = random, randomseed

local env = readonly(G)
for _, name in ipairs({'string', 'math', 'table', 'coroutine'}) do
  G[name] = readonly(G[name])
end
G.redis = readonly(redis)
G._G = env
G.rawset = function(t, k, v)
  if protected[t] then raw_error(READONLY, 0) end
  return raw_rawset(t, k, v)
end
G.loadstring = function(...)
  local f, e = raw_loadstring(...)
  if f then raw_setfenv(f, env) end
  return f, e
end
G.load = function(...)
  local f, e = raw_load(...)
  if f then raw_setfenv(f, env) end
  return f, e
end
raw_setmetatable(G, {
  __index = function(_, name)
    raw_error("Script attempted to access nonexistent global variable '" .. raw_tostring(name) .. "'", 2)
  end,
})

-- Redis's error handler: the error as a table {err=..., source=...,
-- line=...}, the place being the script's line that failed (a C function
-- or a frame of this prelude is passed over).
local function handler(err)
  if raw_type(err) == 'userdata' then err = take_pending() or err end
  local level = 2
  local i = dbg.getinfo(level, 'nSl')
  if i and i.what == 'C' then
    level = level + 1
    i = dbg.getinfo(level, 'nSl')
  end
  while i and i.source == '=sim_redis' do
    level = level + 1
    i = dbg.getinfo(level, 'nSl')
  end
  if raw_type(err) ~= 'table' then
    err = {err = 'ERR ' .. raw_tostring(err)}
  end
  if i then
    err['source'] = i.source
    err['line'] = i.currentline
  end
  return err
end

-- Runs a script: its arguments as the globals KEYS and ARGV, `call` as
-- redis.call's way to the server. Returns ok and the first result (or
-- the error table).
local function run(f, keys, argv, call, pcall)
  G.KEYS, G.ARGV = keys, argv
  pending = false
  redis.call, redis.pcall = call, pcall
  local ok, result = xpcall(f, handler)
  redis.call, redis.pcall = outside, outside
  return ok, result
end

return env, run, set_pending
