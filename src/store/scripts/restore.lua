-- restore: let a master that lost its data vote again, once it is safe.
--
-- Raises the fencing counter to at least what a majority of masters hold (or the floor an
-- operator's recovery chose), then puts the marker back with a new identity, so that the
-- high-water marks other masters recorded for its old self no longer apply. With a run id,
-- it is recorded beside the marker (`<marker>:run`) in the same step: the master process
-- the marker was written under, so that a restart after it is seen by every replica,
-- including one that meets the master for the first time (store/health).
--
-- KEYS[1] the fencing counter, KEYS[2] the marker
-- ARGV[1] the counter value to raise to, ARGV[2] the master's new identity,
-- ARGV[3] (optional) the master's run id as the restoring replica's probe read it
--
-- Example: EVALSHA <sha> 2 redlockd:fence redlockd:marker 1042 k2V9c0xq 5f0c...e1
-- Returns the counter after the raise.
if #KEYS ~= 2 or (#ARGV ~= 2 and #ARGV ~= 3) then
  return redis.error_reply('restore expects 2 keys and 2 or 3 arguments')
end
-- A master in a data layout this release does not know is refused, never written or
-- misread (layout.lua, put before this file).
local refused = layout_refused(redis.call('GET', KEYS[2] .. ':layout'))
if refused then return redis.error_reply(refused) end
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  fence = tonumber(ARGV[1])
end
redis.call('SET', KEYS[2], ARGV[2])
if ARGV[3] then
  redis.call('SET', KEYS[2] .. ':run', ARGV[3])
end
return fence
