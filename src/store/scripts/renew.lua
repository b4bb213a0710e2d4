-- renew: extend a lock, but only for the lease that holds it (compare, then PEXPIRE), and
-- optionally replace its owner text (an elected leader proclaiming a new value).
--
-- KEYS[1] the lock hash, KEYS[2] the marker, KEYS[3] the name's claim (a lease with a
-- lock-delay keeps its 'd:' claim its TTL and the delay ahead, see acquire.lua), and for a
-- shared hold (share.lua) KEYS[4] the lock's set of shared holders, which must live as long
-- as the hold
-- ARGV[1] lease id, ARGV[2] new TTL in ms ('' keeps the lease's own TTL), ARGV[3] the
-- held stream that takes the lease over ('' for none: a resume elsewhere names its own, see
-- release.lua), ARGV[4] (optional) the new owner text
--
-- A lease held through a session (session.lua; 'session' in the hash) lives as long as its
-- session: renewing the lease itself extends nothing (a new owner text is still taken: a
-- leader proclaims) and answers the session's TTL (its 'ttl', as read.lua reports it) with
-- what is left of it (the PTTL, which is what the caller's validity is worked out from).
--
-- A resume ('stream' in the hash): the held stream that now keeps the lease. A stream's own
-- end revokes the lease only while the stream is still the lease's (release.lua), so that a
-- connection that closes after its holder resumed elsewhere takes nothing with it. A
-- stream's name is '<opener>/<random>' (the opener: a tag of the token that opened the hold,
-- '' without authentication; a name without '/' has the opener ''). A stream opened by
-- another token does not take the lease over: the lease is renewed, and the answer names the
-- stream that still keeps it, which is how the resume learns that it was refused. A lease no
-- stream has kept yet (granted as JSON) is taken over by any.
--
-- Example: EVALSHA <sha> 3 redlockd:lock:a redlockd:marker redlockd:claim:a Zm9v 60000 ''
-- Returns {1, token, ttl_ms, pttl_ms, owner, stream} when renewed (stream: the held
-- stream that keeps the lease, '' for the one that granted it or none), {0} when the lease
-- does not hold the lock here, {-1} when the marker is missing.
if (#KEYS ~= 3 and #KEYS ~= 4) or (#ARGV ~= 3 and #ARGV ~= 4) then
  return redis.error_reply('renew expects 3 or 4 keys and 3 or 4 arguments')
end
if not marked(KEYS[2]) then return {-1} end
local holder = redis.call('HMGET', KEYS[1], 'lease', 'delay', 'session')
if holder[1] ~= ARGV[1] then
  return {0}
end
if ARGV[3] ~= '' then
  local kept = redis.call('HGET', KEYS[1], 'stream')
  if not kept or kept == '' or opener(kept) == opener(ARGV[3]) then
    redis.call('HSET', KEYS[1], 'stream', ARGV[3])
  end
end
if holder[3] then
  if #ARGV == 4 then
    redis.call('HSET', KEYS[1], 'owner', ARGV[4])
  end
  local fields = redis.call('HMGET', KEYS[1], 'token', 'owner', 'ttl', 'stream')
  local pttl = redis.call('PTTL', KEYS[1])
  return {1, tonumber(fields[1]), tonumber(fields[3]) or pttl, pttl, fields[2], fields[4] or ''}
end
local ttl = ARGV[2]
if ttl == '' then
  ttl = redis.call('HGET', KEYS[1], 'ttl')
else
  redis.call('HSET', KEYS[1], 'ttl', ttl)
end
if #ARGV == 4 then
  redis.call('HSET', KEYS[1], 'owner', ARGV[4])
end
redis.call('PEXPIRE', KEYS[1], ttl)
if holder[2] then
  redis.call('SET', KEYS[3], 'd:' .. ARGV[1], 'PX', tonumber(ttl) + tonumber(holder[2]))
end
if #KEYS == 4 and redis.call('PTTL', KEYS[4]) < tonumber(ttl) then
  redis.call('PEXPIRE', KEYS[4], ttl)
end
local fields = redis.call('HMGET', KEYS[1], 'token', 'owner', 'stream')
return {1, tonumber(fields[1]), tonumber(ttl), redis.call('PTTL', KEYS[1]), fields[2],
  fields[3] or ''}
