-- delay: how long a lock-delay still refuses grants of a free lock here (inspect).
--
-- KEYS[1] the lock hash, KEYS[2] the name's claim (acquire.lua keeps 'd:<lease>' there
-- for the lease's TTL and its delay), KEYS[3] the marker
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:claim:lock:a redlockd:marker
-- Returns {1, pttl_ms} while the lock is free and a lock-delay claims its name, {0} when
-- the lock is held or no delay runs, {-1} when the marker is missing.
if #KEYS ~= 3 or #ARGV ~= 0 then
  return redis.error_reply('delay expects 3 keys and no arguments')
end
if not marked(KEYS[3]) then return {-1} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
local claimed = redis.call('GET', KEYS[2])
if not claimed or string.sub(claimed, 1, 2) ~= 'd:' then return {0} end
local pttl = redis.call('PTTL', KEYS[2])
if pttl <= 0 then return {0} end
return {1, pttl}
