-- members: the names a several-name lease holds (acquire_many.lua), read through one of
-- them, so that a renew or a revoke through any of its names finds the others.
--
-- KEYS[1] the lock hash of one of its names, KEYS[2] the marker
-- ARGV[1] the lease id
--
-- Example: EVALSHA <sha> 2 redlockd:lock:a redlockd:marker Zm9v_m
-- Returns {1, 'a b'} when the lease holds the name here, {0} when it does not, {-1} when
-- the marker is missing.
if #KEYS ~= 2 or #ARGV ~= 1 then
  return redis.error_reply('members expects 2 keys and 1 argument')
end
if not marked(KEYS[2]) then return {-1} end
local f = redis.call('HMGET', KEYS[1], 'lease', 'group')
if f[1] ~= ARGV[1] or not f[2] then
  return {0}
end
return {1, f[2]}
