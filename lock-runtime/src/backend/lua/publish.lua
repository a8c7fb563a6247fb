-- publish_to(channel, message): PUBLISH, or SPUBLISH for a channel with a
-- hash tag: on a Redis Cluster a client listens on one channel per slot,
-- `lock-waiters:<id>:{<tag>}`, in the slot of the locks its waiters queue
-- for, so the message stays on the shard of the script's keys (sharded
-- pub/sub, Redis 7) instead of going to every node. Replies how many
-- clients received it.
local function publish_to(channel, message)
  if string.find(channel, '{', 1, true) then
    return redis.call('SPUBLISH', channel, message)
  end
  return redis.call('PUBLISH', channel, message)
end
