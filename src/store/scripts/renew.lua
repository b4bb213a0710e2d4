-- renew: extend a lock, but only for the lease that holds it (compare, then PEXPIRE), and
-- optionally replace its owner text (an elected leader proclaiming a new value).
--
-- KEYS[1] the lock hash, KEYS[2] the marker, and for a shared hold (share.lua) KEYS[3] the
-- lock's set of shared holders, which must live as long as the hold
-- ARGV[1] lease id, ARGV[2] new TTL in ms ('' keeps the lease's own TTL),
-- ARGV[3] (optional) the new owner text
--
-- Example: EVALSHA <sha> 2 redlockd:lock:a redlockd:marker Zm9v 60000
-- Returns {1, token, ttl_ms, pttl_ms, owner} when renewed, {0} when the lease does not
-- hold the lock here, {-1} when the marker is missing.
if (#KEYS ~= 2 and #KEYS ~= 3) or (#ARGV ~= 2 and #ARGV ~= 3) then
  return redis.error_reply('renew expects 2 or 3 keys and 2 or 3 arguments')
end
if redis.call('EXISTS', KEYS[2]) == 0 then return {-1} end
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then
  return {0}
end
local ttl = ARGV[2]
if ttl == '' then
  ttl = redis.call('HGET', KEYS[1], 'ttl')
else
  redis.call('HSET', KEYS[1], 'ttl', ttl)
end
if #ARGV == 3 then
  redis.call('HSET', KEYS[1], 'owner', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ttl)
if #KEYS == 3 and redis.call('PTTL', KEYS[3]) < tonumber(ttl) then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
local fields = redis.call('HMGET', KEYS[1], 'token', 'owner')
return {1, tonumber(fields[1]), tonumber(ttl), redis.call('PTTL', KEYS[1]), fields[2]}
