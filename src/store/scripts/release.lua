-- release: delete a lock, but only for the lease that holds it (compare, then DEL), and
-- announce the release so that waiting grants in every redlockd replica wake at once.
--
-- KEYS[1] the lock hash, KEYS[2] the marker
-- ARGV[1] lease id, ARGV[2] the release channel, ARGV[3] the lock name (the message)
--
-- Example: EVALSHA <sha> 2 redlockd:lock:a redlockd:marker Zm9v redlockd:released a
-- Returns 1 when deleted, 0 when the lease does not hold the lock here, -1 when the
-- marker is missing.
if #KEYS ~= 2 or #ARGV ~= 3 then
  return redis.error_reply('release expects 2 keys and 3 arguments')
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return -1
end
if redis.call('HGET', KEYS[1], 'lease') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
