-- release: delete a lock, but only for the lease that holds it (compare, then DEL), and on
-- a revoke announce the release, to those listening only: waiting grants marked the hash
-- ('waited'), and an observed hold was marked when made ('observed'; see acquire.lua).
-- The clean-up of a failed attempt does not announce (nothing was granted), except to a
-- grant that waited on what the attempt took ('waited': it met the attempt's hold, or its
-- claim, which the attempt ended, see acquire.lua), on the release channel only. Two
-- announcements: the bare name on the release channel (what every version of redlockd
-- listens to, to wake its waiters), and 'released <token> <name>' on the events channel
-- (ordered by token, for observers). The name stays in the index (see acquire.lua).
--
-- KEYS[1] the lock hash, KEYS[2] the marker, KEYS[3] the name's claim, and for a shared
-- hold (share.lua) KEYS[4] the lock's set of shared holders, which the hold leaves
-- ARGV[1] lease id, ARGV[2] the release channel, ARGV[3] '1' to announce a revoke, '2' an
-- administrator's eviction (announced as 'evicted <token> <name>' in place of
-- 'released ...'), '0' not to announce, ARGV[4] the events channel, ARGV[5] the name as
-- announced (a mutex's bare name; '/elections/<name>' for an election, which no lock name
-- can spell, so that it wakes no lock's waiters), ARGV[6] when undoing a keyed grant's
-- attempt, its nonce ('' otherwise), ARGV[7] '' or, for the end of a held stream, '='
-- and the stream's name ('=' alone: the stream that granted the lease), and on a Redis
-- Cluster master ARGV[8] 's': both channels are then shard channels of the name's hash
-- slot (SPUBLISH, which reaches only the shard that serves it)
--
-- A held stream's end revokes only while that stream still keeps the lease: once its
-- holder resumed it through another stream ('stream' in the hash, set by renew.lua), the
-- old stream's end leaves it alone.
--
-- A several-name lease's member that a grant of the one name waited for ('single', see
-- acquire.lua): its revoke leaves that name's turn to single grants, a claim 't:' for
-- 250 ms (enough for the announcement to reach a replica and its waiter to try) that
-- grants of several names wait behind, in place of the next several-name grant's claim
-- (that grant claims again once a single grant holds the name).
--
-- A lease with a lock-delay ('delay' in the hash): a revoke (or an undo) removes its 'd:'
-- claim, so that the name is free at once; an eviction restarts the delay from now (see
-- acquire.lua).
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:marker redlockd:claim:a Zm9v
--          redlockd:released 1 redlockd:events a '' ''
-- A lease granted with an Idempotency-Key names its key's record in the hash ('idem'):
-- the clean-up of a failed attempt deletes the record too, so that a retry of the same key
-- may try again; a revoke keeps it (see acquire.lua). A keyed attempt's clean-up deletes
-- only a hold that attempt made and that no other attempt has answered for since.
--
-- Returns 1 when deleted, 0 when the lease does not hold the lock here, -1 when the
-- marker is missing.
if (#KEYS ~= 3 and #KEYS ~= 4) or (#ARGV ~= 7 and #ARGV ~= 8) then
  return redis.error_reply('release expects 3 or 4 keys and 7 or 8 arguments')
end
local publish = ARGV[8] == 's' and 'SPUBLISH' or 'PUBLISH'
if not marked(KEYS[2]) then return -1 end
local held = redis.call('HMGET', KEYS[1], 'lease', 'token', 'idem', 'made', 'seen', 'waited',
  'observed', 'delay', 'group', 'single', 'stream')
if held[1] ~= ARGV[1] then
  return 0
end
if ARGV[7] ~= '' and (held[11] or '') ~= string.sub(ARGV[7], 2) then
  return 0
end
if ARGV[6] ~= '' and (held[4] ~= ARGV[6] or held[5] ~= ARGV[6]) then
  return 0
end
redis.call('DEL', KEYS[1])
if #KEYS == 4 then
  redis.call('SREM', KEYS[4], ARGV[1])
end
if held[8] then
  if ARGV[3] == '2' then
    redis.call('SET', KEYS[3], 'd:' .. ARGV[1], 'PX', held[8])
  elseif redis.call('GET', KEYS[3]) == 'd:' .. ARGV[1] then
    redis.call('DEL', KEYS[3])
  end
end
if held[3] and ARGV[3] == '0' then
  redis.call('DEL', held[3])
end
if held[9] and held[10] and ARGV[3] ~= '0' then
  local c = redis.call('GET', KEYS[3])
  if not c or string.sub(c, 1, 2) ~= 'd:' then
    redis.call('SET', KEYS[3], 't:', 'PX', 250)
  end
end
if held[6] then
  redis.call(publish, ARGV[2], ARGV[5])
end
if ARGV[3] ~= '0' then
  if held[7] then
    local verb = ARGV[3] == '2' and 'evicted ' or 'released '
    redis.call(publish, ARGV[4], verb .. (held[2] or '0') .. ' ' .. ARGV[5])
  end
end
return 1
