-- release: delete a lock, but only for the lease that holds it (compare, then DEL), and on
-- a revoke announce the release so that waiting grants and observers in every redlockd
-- replica learn of it at once. The clean-up of a failed attempt does not announce:
-- nothing was granted. Two announcements: the bare name on the release channel (what
-- every version of redlockd listens to, to wake its waiters) and 'released <token> <name>'
-- on the events channel (ordered by token, for observers).
--
-- KEYS[1] the lock hash, KEYS[2] the marker, KEYS[3] the index of names
-- ARGV[1] lease id, ARGV[2] the release channel, ARGV[3] the lock name (its member in the
-- index), ARGV[4] '1' to announce, '0' not to, ARGV[5] the events channel, ARGV[6] the name
-- as announced (a mutex's bare name; '/elections/<name>' for an election, which no lock
-- name can spell, so that it wakes no lock's waiters)
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:marker redlockd:names Zm9v redlockd:released a 1 redlockd:events a
-- Returns 1 when deleted, 0 when the lease does not hold the lock here, -1 when the
-- marker is missing.
if #KEYS ~= 3 or #ARGV ~= 6 then
  return redis.error_reply('release expects 3 keys and 6 arguments')
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
local held = redis.call('HMGET', KEYS[1], 'lease', 'token')
if held[1] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[3])
if ARGV[4] == '1' then
  redis.call('PUBLISH', ARGV[2], ARGV[6])
  redis.call('PUBLISH', ARGV[5], 'released ' .. (held[2] or '0') .. ' ' .. ARGV[6])
end
return 1
