-- publish_to(channel, message): PUBLISH, or SPUBLISH for a channel with a
-- hash tag: on a Redis Cluster a client listens on one channel per slot,
-- `lock-waiters:<id>:{<tag>}`, in the slot of the locks its waiters queue
-- for, so the message stays on the shard of the script's keys (sharded
-- pub/sub, Redis 7) instead of going to every node. Replies how many
-- clients received it. A message that cannot be sent (SPUBLISH unknown
-- before Redis 7, a publish the ACL refuses) is not a reason to fail the
-- release that sends it, nor to leave its other writes undone: 0, and the
-- waiter's timed retry takes over. A refused publish is remembered, and
-- told(reply) makes the script's reply say so.
local publish_refused = false
local function publish_to(channel, message)
  local command = 'PUBLISH'
  if string.find(channel, '{', 1, true) then command = 'SPUBLISH' end
  local received = redis.pcall(command, channel, message)
  if type(received) == 'number' then return received end
  local said = type(received) == 'table' and received.err
  if said and (string.find(said, 'user executing the script', 1, true)
      or string.find(said, 'NOPERM', 1, true)) then
    publish_refused = said
  end
  return 0
end
-- told(reply): a publishing script's reply; `{reply, <Redis's error>}` when
-- the ACL refused one of its publishes (the client warns once).
local function told(reply)
  if publish_refused then return {reply, publish_refused} end
  return reply
end
