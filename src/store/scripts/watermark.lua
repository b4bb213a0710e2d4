-- watermark: record the highest fencing counter seen on other masters, by their identity.
--
-- Counters only rise, so a master whose counter is later found below what is recorded here
-- for it went back in time. Each field keeps the larger of the recorded and given value.
--
-- KEYS[1] the watermark hash   e.g. redlockd:watermarks
-- KEYS[2] the master's marker   e.g. redlockd:marker (only its layout is read)
-- ARGV    pairs of identity and counter value
--
-- Example: EVALSHA <sha> 2 redlockd:watermarks redlockd:marker k2V9c0xq 1042 Qm9vZ2xl 977
-- Returns the number of fields raised.
if #KEYS ~= 2 or #ARGV % 2 ~= 0 then
  return redis.error_reply('watermark expects 2 keys and pairs of arguments')
end
-- A master in a data layout this release does not know is refused, never written or
-- misread (layout.lua, put before this file).
local refused = layout_refused(redis.call('GET', KEYS[2] .. ':layout'))
if refused then return redis.error_reply(refused) end
local raised = 0
for i = 1, #ARGV, 2 do
  local seen = tonumber(ARGV[i + 1])
  local recorded = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if seen > recorded then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    raised = raised + 1
  end
end
return raised
