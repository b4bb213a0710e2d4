-- unmark: take the vote away from a master that went back in time (its fencing counter is
-- below what the other masters recorded for it: it restarted from an old snapshot and may
-- have lost locks). Every script refuses to act on a master without its marker, so every
-- redlockd replica stops counting it at once; it is restored after its quarantine.
--
-- Compare-and-delete: a marker that a restore has meanwhile rewritten (a new identity) is
-- left alone.
--
-- KEYS[1] the marker
-- ARGV[1] the identity the marker must still carry
--
-- Example: EVALSHA <sha> 1 redlockd:marker k2V9c0xq
-- Returns 1 when removed, 0 when the marker carries another identity or is gone.
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply('unmark expects 1 key and 1 argument')
end
-- A master in a data layout this release does not know is refused, never written or
-- misread (layout.lua, put before this file).
local refused = layout_refused(redis.call('GET', KEYS[1] .. ':layout'))
if refused then return redis.error_reply(refused) end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
