-- acquire_many: several locks under one lease, all of them or none, with one fencing token
-- from this master's counter for all of them.
--
-- Each name's lock hash is laid out as acquire.lua's, with 'group' (the names, sorted,
-- separated by spaces) so that a renew or a revoke through any one of them finds the
-- others (members.lua). The names come sorted: two grants of the same names never hold
-- part of them each on one master (this script is atomic), whatever order their clients
-- listed them in.
--
-- A waiting grant claims each name it finds held ('g:' and the claimant, the first half of
-- its attempts' lease ids, until the holder would lapse and a second longer, but no longer
-- than the grant will still wait): exclusive
-- grants of single names (acquire.lua) and shared ones (share.lua) then wait behind it, so
-- that single grants that keep taking one of its names do not starve it. In turn, grants of
-- several names that keep taking a name do not starve single grants of it: a several-name
-- lease that a single grant waited for leaves the name's turn to single grants when it is
-- revoked (release.lua's 't:', in place of the next several-name grant's claim), and this
-- grant waits behind that turn. A grant meets
-- another several-name grant's claim on any of its names: it waits, and claims nothing,
-- so that no two such grants wait on each other's claims. A waiting grant marks a claim it
-- meets, and the grant that ends a marked claim by taking the name marks its hash
-- 'waited' (see acquire.lua): the release wakes the grant that met it, on any replica.
--
-- KEYS[1] the fencing counter, KEYS[2] the marker, KEYS[3] the index of names, then for
-- each name: its lock hash, its set of shared holders, its claim; with an Idempotency-Key,
-- last, the key's record.
-- ARGV[1] lease id, ARGV[2] TTL in ms, ARGV[3] owner ('' for none), ARGV[4] who listens
-- ('w', 'o', as acquire.lua), ARGV[5] the lock key prefix (e.g. redlockd:lock:; '' on a Redis Cluster master, which
-- keeps no index: KEYS[3] then repeats KEYS[1] untouched), ARGV[6]
-- the names joined by spaces, ARGV[7] the claimant, ARGV[8] the readers' key prefix (e.g.
-- redlockd:reader:, or redlockd:reader:{ on a Redis Cluster master), ARGV[9] how much
-- longer the grant will wait in ms (its claims last no
-- longer), then the names in order; with an Idempotency-Key, last, the request's
-- fingerprint and this attempt's nonce.
--
-- Example: EVALSHA <sha> 9 redlockd:fence redlockd:marker redlockd:names
--          redlockd:lock:a redlockd:shared:lock:a redlockd:claim:lock:a
--          redlockd:lock:b redlockd:shared:lock:b redlockd:claim:lock:b
--          Zm9v_m 30000 '' w redlockd:lock: 'a b' Zm9vYmFy redlockd:reader: 5000 a b
-- Returns {1, token} when granted (or, with a key, when this lease holds them already),
-- {0, pttl_ms, lease} for the first name held by another lease (or claimed by another
-- several-name grant), {-1} when the marker is missing, {-2}, {-3} and {-4, pttl_ms} (a
-- name's ended lease's lock-delay, see acquire.lua) as acquire.lua. A lock-delay's claim
-- ('d:...') is never replaced by this grant's.
-- A cluster's readers' keys carry their lock's name as a hash tag: ARGV[8] ends with '{'.
local close = string.sub(ARGV[8], -1) == '{' and '}/' or '/'
local keyed = (#KEYS - 3) % 3 == 1
local n = math.floor((#KEYS - 3) / 3)
if n < 1 or #ARGV ~= 9 + n + (keyed and 2 or 0) then
  return redis.error_reply('acquire_many expects 3 + 3n keys (+1) and 9 + n arguments (+2)')
end
if not marked(KEYS[2]) then return {-1} end
local record = keyed and redis.call('GET', KEYS[#KEYS])
if record and record ~= ARGV[9 + n + 1] then
  return {-2}
end
local lease, waiting = ARGV[1], string.find(ARGV[4], 'w', 1, true)
local mine = 'g:' .. ARGV[7]
local function unmarked(c) return (string.gsub(c, ' w$', '')) end
local function lock(i) return KEYS[3 + 3 * (i - 1) + 1] end
local function shared(i) return KEYS[3 + 3 * (i - 1) + 2] end
local function claim(i) return KEYS[3 + 3 * (i - 1) + 3] end
local function name(i) return ARGV[9 + i] end
local first = redis.call('HMGET', lock(1), 'lease', 'token')
if keyed and first[1] == lease then
  -- Answered a validity from now: each name's hold and the record last the TTL from now
  -- (see acquire.lua); a lease through a session lives as its session does.
  local ttl = tonumber(ARGV[2])
  local refresh = redis.call('HEXISTS', lock(1), 'session') == 0
  for i = 1, n do
    redis.call('HSET', lock(i), 'seen', ARGV[9 + n + 2])
    if refresh and redis.call('HGET', lock(i), 'lease') == lease
        and redis.call('PTTL', lock(i)) < ttl then
      redis.call('PEXPIRE', lock(i), ttl)
    end
  end
  if refresh then redis.call('PEXPIRE', KEYS[#KEYS], ttl) end
  return {1, tonumber(first[2])}
end
for i = 1, n do
  local c = redis.call('GET', claim(i))
  -- Another several-name grant's claim, or a turn left to single grants (release.lua).
  local kind = c and string.sub(c, 1, 2)
  if (kind == 'g:' and unmarked(c) ~= mine) or kind == 't:' then
    local pttl = redis.call('PTTL', claim(i))
    if pttl < 0 then pttl = 0 end
    if waiting then met(claim(i), c) end
    return {0, pttl, unmarked(c)}
  end
  if c and string.sub(c, 1, 2) == 'd:' and redis.call('EXISTS', lock(i)) == 0 then
    local pttl = redis.call('PTTL', claim(i))
    if pttl < 0 then pttl = 0 end
    return {-4, pttl}
  end
end
local blocked
for i = 1, n do
  local pttl, holder = -1, nil
  local held = redis.call('HGET', lock(i), 'lease')
  if held and held ~= lease then
    pttl, holder = redis.call('PTTL', lock(i)), held
    if waiting then redis.call('HSET', lock(i), 'waited', '1') end
  elseif redis.call('EXISTS', shared(i)) == 1 then
    local prefix = ARGV[8] .. name(i) .. close
    for _, reader in ipairs(redis.call('SMEMBERS', shared(i))) do
      local left = redis.call('PTTL', prefix .. reader)
      if left == -2 then
        redis.call('SREM', shared(i), reader)
      else
        if left > pttl then pttl, holder = left, 'shared' end
        if waiting then redis.call('HSET', prefix .. reader, 'waited', '1') end
      end
    end
  end
  if holder then
    if pttl < 0 then pttl = 0 end
    local lasts = math.min(pttl + 1000, tonumber(ARGV[9]) + 100)
    local c = redis.call('GET', claim(i))
    local delayed = c and string.sub(c, 1, 2) == 'd:'
    if waiting and not delayed and redis.call('PTTL', claim(i)) < lasts then
      local mark = c and string.sub(c, -2) == ' w' and ' w' or ''
      redis.call('SET', claim(i), mine .. mark, 'PX', lasts)
    end
    blocked = blocked or {0, pttl, holder}
  end
end
if blocked then return blocked end
if record then return {-3} end
local token = redis.call('INCR', KEYS[1])
for i = 1, n do
  redis.call('HSET', lock(i), 'lease', lease, 'token', token, 'ttl', ARGV[2], 'owner', ARGV[3],
    'group', ARGV[6])
  if string.find(ARGV[4], 'o', 1, true) then
    redis.call('HSET', lock(i), 'observed', '1')
  end
  redis.call('PEXPIRE', lock(i), ARGV[2])
  local ended = redis.call('GETDEL', claim(i))
  if ended and string.sub(ended, -2) == ' w' then
    redis.call('HSET', lock(i), 'waited', '1')
  end
  if keyed then
    local nonce = ARGV[9 + n + 2]
    redis.call('HSET', lock(i), 'idem', KEYS[#KEYS], 'made', nonce, 'seen', nonce)
  end
  indexed(KEYS[3], name(i), ARGV[5])
end
if keyed then
  redis.call('SET', KEYS[#KEYS], ARGV[9 + n + 1], 'PX', ARGV[2])
end
return {1, token}
