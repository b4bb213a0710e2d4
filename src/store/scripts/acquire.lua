-- acquire: set a free lock to a lease and take a fencing token from this master's counter.
--
-- KEYS[1] the lock hash       e.g. redlockd:lock:nightly-report
-- KEYS[2] the fencing counter e.g. redlockd:fence (one per master, not per lock)
-- KEYS[3] the marker          e.g. redlockd:marker (gone = this master lost its data)
-- ARGV[1] lease id, ARGV[2] TTL in ms, ARGV[3] owner ('' for none)
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:fence redlockd:marker Zm9v 30000 worker-1
-- Returns {1, token} when granted, {0, pttl_ms} when another lease holds the lock,
-- {-1} when the marker is missing (the master must not vote).
if #KEYS ~= 3 or #ARGV ~= 3 then
  return redis.error_reply('acquire expects 3 keys and 3 arguments')
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {-1}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then pttl = 0 end
  return {0, pttl}
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'lease', ARGV[1], 'token', token, 'ttl', ARGV[2], 'owner', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token}
