-- release: delete a lock, but only for the lease that holds it (compare, then DEL), and on
-- a revoke announce the release so that waiting grants and observers in every redlockd
-- replica learn of it at once, but only to those listening: waiting grants marked the
-- hash ('waited'), an observed hold was marked when made ('observed'; see acquire.lua).
-- The clean-up of a failed attempt does not announce: nothing was granted. Two announcements: the bare name on the release channel (what
-- every version of redlockd listens to, to wake its waiters) and 'released <token> <name>'
-- on the events channel (ordered by token, for observers).
--
-- KEYS[1] the lock hash, KEYS[2] the marker, KEYS[3] the index of names
-- ARGV[1] lease id, ARGV[2] the release channel, ARGV[3] the lock name (its member in the
-- index), ARGV[4] '1' to announce a revoke, '2' an administrator's eviction (announced as
-- 'evicted <token> <name>' in place of 'released ...'), '0' not to announce, ARGV[5] the events channel, ARGV[6] the name
-- as announced (a mutex's bare name; '/elections/<name>' for an election, which no lock
-- name can spell, so that it wakes no lock's waiters), ARGV[7] when undoing a keyed grant's
-- attempt, its nonce ('' otherwise)
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:marker redlockd:names Zm9v redlockd:released a 1 redlockd:events a ''
-- A lease granted with an Idempotency-Key names its key's record in the hash ('idem'):
-- the clean-up of a failed attempt deletes the record too, so that a retry of the same key
-- may try again; a revoke keeps it (see acquire.lua). A keyed attempt's clean-up deletes
-- only a hold that attempt made and that no other attempt has answered for since.
--
-- Returns 1 when deleted, 0 when the lease does not hold the lock here, -1 when the
-- marker is missing.
if #KEYS ~= 3 or #ARGV ~= 7 then
  return redis.error_reply('release expects 3 keys and 7 arguments')
end
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
local held = redis.call('HMGET', KEYS[1], 'lease', 'token', 'idem', 'made', 'seen', 'waited', 'observed')
if held[1] ~= ARGV[1] then
  return 0
end
if ARGV[7] ~= '' and (held[4] ~= ARGV[7] or held[5] ~= ARGV[7]) then
  return 0
end
redis.call('DEL', KEYS[1])
if held[3] and ARGV[4] == '0' then
  redis.call('DEL', held[3])
end
redis.call('ZREM', KEYS[3], ARGV[3])
if ARGV[4] ~= '0' then
  if held[6] then
    redis.call('PUBLISH', ARGV[2], ARGV[6])
  end
  if held[7] then
    local verb = ARGV[4] == '2' and 'evicted ' or 'released '
    redis.call('PUBLISH', ARGV[5], verb .. (held[2] or '0') .. ' ' .. ARGV[6])
  end
end
return 1
