-- confirm: make a grant's chosen fencing token known to this master.
--
-- Raises the counter to at least the token (set-if-greater), and records the token in the
-- lock hash if the lease still holds the lock here. Idempotent.
--
-- KEYS[1] the lock hash, KEYS[2] the fencing counter, KEYS[3] the marker
-- ARGV[1] lease id, ARGV[2] the chosen token
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:fence redlockd:marker Zm9v 42
-- Returns 1, or -1 when the marker is missing.
if #KEYS ~= 3 or #ARGV ~= 2 then
  return redis.error_reply('confirm expects 3 keys and 2 arguments')
end
if not marked(KEYS[3]) then return -1 end
local token = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[2]) or '0') < token then
  redis.call('SET', KEYS[2], ARGV[2])
end
if redis.call('HGET', KEYS[1], 'lease') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'token', ARGV[2])
end
return 1
