-- share: a shared hold of a lock (`mode: shared`), beside its other shared holders, with a
-- fencing token from this master's counter.
--
-- A shared hold is a hash of its own, one per lease (a "reader"), laid out as acquire.lua's
-- lock hash, so that renew, confirm, release and read treat it as they treat a lock; its
-- lease id is listed in the lock's set of shared holders, which an exclusive grant reads
-- (acquire.lua). The lock is shared while the lock hash itself is free (no exclusive
-- holder) and no waiting exclusive grant has claimed the name (acquire.lua): a shared
-- grant that comes after a waiting exclusive one waits behind it.
--
-- KEYS[1] the shared hold's hash  e.g. redlockd:reader:a/Zm9v_s
-- KEYS[2] the fencing counter     e.g. redlockd:fence
-- KEYS[3] the marker              e.g. redlockd:marker
-- KEYS[4] the index of readers    e.g. redlockd:readers (for inspect, in name order)
-- KEYS[5] the lock hash           e.g. redlockd:lock:a
-- KEYS[6] the shared holders' set e.g. redlockd:shared:a
-- KEYS[7] the exclusive claim     e.g. redlockd:claim:a
-- ARGV[1] lease id, ARGV[2] TTL in ms, ARGV[3] owner ('' for none), ARGV[4] the hold's
-- name in the index (e.g. a/Zm9v_s), ARGV[5] the readers' key prefix (e.g.
-- redlockd:reader:; '' on a Redis Cluster master, which keeps no index: KEYS[4] then
-- repeats KEYS[1] untouched), ARGV[6] who listens ('w', 'o', as acquire.lua), ARGV[7] the prefix of
-- this lock's shared holds' keys (e.g. redlockd:reader:a/), ARGV[8] how long the grant
-- will wait (as acquire.lua's; a shared grant claims nothing)
-- With an Idempotency-Key: KEYS[8] the key's record, ARGV[9] the request's fingerprint and
-- ARGV[10] this attempt's nonce (see acquire.lua).
--
-- The set of shared holders lives at least as long as any of them (each grant and renew
-- extends its TTL to theirs), so that it never vanishes under a live holder, and goes with
-- the last; a release removes its own lease (release.lua), and each grant that adds one
-- removes up to two sampled holders whose keys are gone.
--
-- Returns {1, token} when granted (or, with a key, when this lease holds it already),
-- {0, pttl_ms, lease} while an exclusive lease holds the lock or a waiting exclusive grant
-- has claimed it (its lease, and how long the claim lasts; a waiting grant marks the claim,
-- see acquire.lua), {-1} when the marker is
-- missing, {-2}, {-3} and {-4, pttl_ms} (an ended lease's lock-delay) as acquire.lua.
local keyed = #KEYS == 8 and #ARGV == 10
if not keyed and (#KEYS ~= 7 or #ARGV ~= 8) then
  return redis.error_reply('share expects 7 keys and 8 arguments, or 8 and 10')
end
if not marked(KEYS[3]) then return {-1} end
local record = keyed and redis.call('GET', KEYS[8])
if record and record ~= ARGV[9] then
  return {-2}
end
local mine = redis.call('HMGET', KEYS[1], 'lease', 'token')
if keyed and mine[1] == ARGV[1] then
  redis.call('HSET', KEYS[1], 'seen', ARGV[10])
  -- Answered a validity from now: make the hold, the set and the record last the TTL from
  -- now (see acquire.lua); a hold through a session lives as its session does.
  local ttl = tonumber(ARGV[2])
  if redis.call('HEXISTS', KEYS[1], 'session') == 0 and redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[8], ttl)
    if redis.call('PTTL', KEYS[6]) < ttl then redis.call('PEXPIRE', KEYS[6], ttl) end
  end
  return {1, tonumber(mine[2])}
end
local waiting = string.find(ARGV[6], 'w', 1, true)
local held = redis.call('HGET', KEYS[5], 'lease')
if held then
  if waiting then
    redis.call('HSET', KEYS[5], 'waited', '1', 'single', '1')
  end
  local pttl = redis.call('PTTL', KEYS[5])
  if pttl < 0 then pttl = 0 end
  return {0, pttl, held}
end
-- A turn left to grants of one name ('t:', see acquire.lua) is this grant's too.
local claim = redis.call('GET', KEYS[7])
if claim and string.sub(claim, 1, 2) ~= 't:' then
  local pttl = redis.call('PTTL', KEYS[7])
  if pttl < 0 then pttl = 0 end
  if string.sub(claim, 1, 2) == 'd:' then return {-4, pttl} end
  -- Marked, so that the grant that ends the claim wakes this one (see acquire.lua).
  if waiting and pttl > 0 and string.sub(claim, -2) ~= ' w' then
    redis.call('SET', KEYS[7], claim .. ' w', 'PX', pttl)
  end
  return {0, pttl, (string.gsub(claim, ' w$', ''))}
end
if record then
  return {-3}
end
local ttl = tonumber(ARGV[2])
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'lease', ARGV[1], 'token', token, 'ttl', ARGV[2], 'owner', ARGV[3])
if string.find(ARGV[6], 'o', 1, true) then
  redis.call('HSET', KEYS[1], 'observed', '1')
end
redis.call('PEXPIRE', KEYS[1], ttl)
if keyed then
  redis.call('HSET', KEYS[1], 'idem', KEYS[8], 'made', ARGV[10], 'seen', ARGV[10])
  redis.call('SET', KEYS[8], ARGV[9], 'PX', ttl)
end
if redis.call('SADD', KEYS[6], ARGV[1]) == 1 then
  for _, stale in ipairs(redis.call('SRANDMEMBER', KEYS[6], 2)) do
    if redis.call('EXISTS', ARGV[7] .. stale) == 0 then
      redis.call('SREM', KEYS[6], stale)
    end
  end
end
if redis.call('PTTL', KEYS[6]) < ttl then
  redis.call('PEXPIRE', KEYS[6], ttl)
end
indexed(KEYS[4], ARGV[4], ARGV[5])
return {1, token}
