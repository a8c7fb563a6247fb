-- publish_to(channel, message): PUBLISH, or SPUBLISH for a channel with a
-- hash tag: on a Redis Cluster a client listens on one channel per slot,
-- `lock-waiters:<id>:{<tag>}`, in the slot of the locks its waiters queue
-- for, so the message stays on the shard of the script's keys (sharded
-- pub/sub, Redis 7) instead of going to every node. Replies how many
-- clients received it. A message that cannot be sent (SPUBLISH unknown
-- before Redis 7) is not a reason to fail the release that sends it: 0,
-- and the waiter's timed retry takes over.
local function publish_to(channel, message)
  if string.find(channel, '{', 1, true) then
    local received = redis.pcall('SPUBLISH', channel, message)
    if type(received) == 'number' then return received end
    return 0
  end
  return redis.call('PUBLISH', channel, message)
end
