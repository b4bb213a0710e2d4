-- verified: record that a master which restarted kept every write it acknowledged (it
-- runs `appendonly yes` with `appendfsync always`), so that it votes on as it is.
--
-- The run record (`<marker>:run`) names the master process under which the marker was
-- written or the data last verified; a probe that finds another run id there knows the
-- master restarted since and judges what it came back with (store/health). Written only
-- while the marker still carries the identity the replica verified: a marker that another
-- replica removed meanwhile (it judged the master to have lost its data) is not vouched
-- for again.
--
-- KEYS[1] the marker
-- ARGV[1] the identity the marker must still carry, ARGV[2] the master's run id
--
-- Example: EVALSHA <sha> 1 redlockd:marker k2V9c0xq 5f0c...e1
-- Returns 1 when recorded, 0 when the marker carries another identity or is gone.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('verified expects 1 key and 2 arguments')
end
-- A master in a data layout this release does not know is refused, never written or
-- misread (layout.lua, put before this file).
local refused = layout_refused(redis.call('GET', KEYS[1] .. ':layout'))
if refused then return redis.error_reply(refused) end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1] .. ':run', ARGV[2])
  return 1
end
return 0
