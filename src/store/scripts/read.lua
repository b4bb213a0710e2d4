-- read: a lock's holding on this master.
--
-- KEYS[1] the lock hash, KEYS[2] the marker
--
-- Example: EVALSHA <sha> 2 redlockd:lock:a redlockd:marker
-- Returns {1, lease, token, ttl_ms, pttl_ms, owner} when held, {0} when free, {-1} when the
-- marker is missing.
if #KEYS ~= 2 or #ARGV ~= 0 then
  return redis.error_reply('read expects 2 keys and no arguments')
end
if not marked(KEYS[2]) then return {-1} end
local fields = redis.call('HMGET', KEYS[1], 'lease', 'token', 'ttl', 'owner')
if not fields[1] then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then pttl = 0 end
return {1, fields[1], tonumber(fields[2]), tonumber(fields[3]), pttl, fields[4]}
