-- clocks: record how far this master's clock stands from one replica's, as that replica
-- last read it, so that a replica meeting this master for the first time can tell a clock
-- that has stood there all along (watched by others) from one that jumped unwatched.
--
-- KEYS[1] the hash of records   e.g. redlockd:clocks
-- ARGV[1] the replica's id (random, new each process), ARGV[2] its offset in microseconds
-- (this master's clock minus the replica's wall clock; negative when behind)
--
-- Each field is '<offset_us> <recorded_at_us>', the time by this master's clock. Records
-- older than a minute by this master's clock are removed (replicas that stopped).
--
-- Example: EVALSHA <sha> 1 redlockd:clocks 5f3a9c 1520
-- Returns the number of records kept.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('clocks expects 1 key and 2 arguments')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. string.format('%d', now))
local fields = redis.call('HGETALL', KEYS[1])
local kept = 0
for i = 1, #fields, 2 do
  local at = tonumber(string.match(fields[i + 1], ' (%-?%d+)$') or '0')
  if now - at > 60000000 then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    kept = kept + 1
  end
end
return kept
