-- restore: let a master that lost its data vote again, once it is safe.
--
-- Raises the fencing counter to at least what a majority of masters hold, then puts the
-- marker back. Only called after the master's quarantine (the largest TTL) is over.
--
-- KEYS[1] the fencing counter, KEYS[2] the marker
-- ARGV[1] the counter value to raise to
--
-- Example: EVALSHA <sha> 2 redlockd:fence redlockd:marker 1042
-- Returns the counter after the raise.
if #KEYS ~= 2 or #ARGV ~= 1 then
  return redis.error_reply('restore expects 2 keys and 1 argument')
end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  fence = tonumber(ARGV[1])
end
redis.call('SET', KEYS[2], '1')
return fence
