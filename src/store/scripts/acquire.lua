-- acquire: set a free lock to a lease and take a fencing token from this master's counter.
--
-- KEYS[1] the lock hash       e.g. redlockd:lock:nightly-report
-- KEYS[2] the fencing counter e.g. redlockd:fence (one per master, not per lock)
-- KEYS[3] the marker          e.g. redlockd:marker (gone = this master lost its data)
-- KEYS[4] the index of names  e.g. redlockd:names (for listing in name order)
-- ARGV[1] lease id, ARGV[2] TTL in ms, ARGV[3] owner ('' for none), ARGV[4] the lock name,
-- ARGV[5] the lock key prefix (e.g. redlockd:lock:)
--
-- A grant adds its name to the index. Names of locks that expired stay there until met:
-- two sampled names are checked on each grant, so stale names stay a bounded share.
--
-- Example: EVALSHA <sha> 4 redlockd:lock:a redlockd:fence redlockd:marker redlockd:names
--          Zm9v 30000 worker-1 a redlockd:lock:
-- Returns {1, token} when granted, {0, pttl_ms, lease} when another lease holds the lock,
-- {-1} when the marker is missing (the master must not vote).
if #KEYS ~= 4 or #ARGV ~= 5 then
  return redis.error_reply('acquire expects 4 keys and 5 arguments')
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {-1}
end
local holder = redis.call('HGET', KEYS[1], 'lease')
if holder then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then pttl = 0 end
  return {0, pttl, holder}
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'lease', ARGV[1], 'token', token, 'ttl', ARGV[2], 'owner', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
for _, stale in ipairs(redis.call('ZRANDMEMBER', KEYS[4], 2)) do
  if redis.call('EXISTS', ARGV[5] .. stale) == 0 then
    redis.call('ZREM', KEYS[4], stale)
  end
end
redis.call('ZADD', KEYS[4], 0, ARGV[4])
return {1, token}
