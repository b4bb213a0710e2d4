-- acquire: set a free lock to a lease and take a fencing token from this master's counter.
--
-- KEYS[1] the lock hash       e.g. redlockd:lock:nightly-report
-- KEYS[2] the fencing counter e.g. redlockd:fence (one per master, not per lock)
-- KEYS[3] the marker          e.g. redlockd:marker (gone = this master lost its data)
-- KEYS[4] the index of names  e.g. redlockd:names (for listing in name order)
-- KEYS[5] the name's shared holders: a set of their lease ids, e.g. redlockd:shared:a
-- KEYS[6] a waiting exclusive grant's claim on the name, e.g. redlockd:claim:a
-- ARGV[1] lease id, ARGV[2] TTL in ms, ARGV[3] owner ('' for none), ARGV[4] the lock name,
-- ARGV[5] the lock key prefix (e.g. redlockd:lock:; '' on a Redis Cluster master, which
-- keeps no index of names, and KEYS[4] then repeats KEYS[1] untouched), ARGV[6] who listens: 'w' when the
-- grant will wait if the lock is held, 'o' when the hold it makes is observed (both: 'wo'),
-- 'a' when its release is always to wake waiters (a semaphore's slot: its waiters read the
-- slots and mark none)
-- ARGV[7] the prefix of the name's shared holds' keys (e.g. redlockd:reader:a/; see
-- share.lua), ARGV[8] how much longer the grant will wait in ms (its claim lasts no longer),
-- ARGV[9] the lease's lock-delay in ms ('0' for none).
-- With an Idempotency-Key: KEYS[7] the key's record (e.g. redlockd:idem:<hash of the key>),
-- ARGV[10] the request's fingerprint (kind, name, TTL, owner) and ARGV[11] this attempt's
-- nonce. The lease id is derived from the key and the fingerprint, so a retry asks for the
-- very lease it may have won. The hash notes which attempt made the hold ('made') and which
-- last answered for it ('seen'): a failed attempt undoes only a hold it made that no other
-- attempt has answered for since (see release.lua), so that it never takes away what a
-- concurrent retry of the same key is counting on.
--
-- The record outlives a revoke (until the grant's TTL) so that a retry arriving after the
-- holder let go does not lock again for nobody; the clean-up of a failed attempt deletes
-- it (see release.lua).
--
-- A release announces itself only to listeners: a waiting grant that finds the lock held
-- marks the hash ('waited'), and an observed hold is marked when it is made ('observed');
-- release.lua reads both.
--
-- A grant adds its name to the index; a release leaves it there (re-granted names, the
-- common case, then cost the index nothing). Names whose lock has ended stay until met:
-- each grant that adds a new name checks two sampled names and removes those that ended,
-- so ended names stay a bounded share (about half at worst), and listing skips them.
--
-- Shared holders (share.lua) each have a key of their own and are listed in KEYS[5]: while
-- one lives (by its key's TTL, so that its renews count), the lock is held, 'shared'. A
-- waiting grant marks each shared hold (its release then wakes the grant) and claims the
-- name (KEYS[6], until the last shared hold would lapse, and a second longer, but no
-- longer than the grant will still wait), so that
-- shared grants that come after it wait behind it (see share.lua). Each attempt of a
-- waiting grant extends the claim (an attempt's lease id is its own, so the claim names
-- only the latest); an exclusive grant removes it (shared grants then wait for that holder
-- anyway, and a writer still waiting claims the name again at its next attempt). A claim
-- by a waiting several-name grant ('g:...', acquire_many.lua) makes this grant wait.
--
-- A waiting grant that meets another's claim (this grant's own kind or any other) marks
-- it: its value then ends in ' w', kept when its claimant's later attempts extend it. The
-- grant that ends a marked claim by taking the name marks its own hash 'waited', so that
-- its release wakes the grant that met the claim, on whichever replica it waits; without
-- the mark that grant heard nothing and slept until the claim would have lapsed.
--
-- A waiting grant that finds the name held also marks the hash 'single' (a grant of this
-- one name waits for it): when a several-name lease that a single grant waited for is
-- revoked, release.lua leaves the name's turn to single grants ('t:', a claim for a
-- moment that grants of several names wait behind and this script ignores), so that
-- several-name grants that keep taking the name on one replica do not starve the single
-- grants of another (see acquire_many.lua).
--
-- Lock-delay: a lease granted with one ('delay' in the hash) also claims its name as
-- 'd:<lease>' until its TTL and the delay after it have passed (renew.lua moves the claim
-- with the TTL, session.lua with its session's). So when the lease ends without its holder's
-- revoke (it expired here, or was evicted: release.lua restarts the delay from then), the
-- claim outlives it by the delay, judged by this master's clock, and every grant of the name
-- (exclusive, shared, several names) is refused as delayed until it lapses. A holder's own
-- revoke removes the claim.
--
-- Example: EVALSHA <sha> 6 redlockd:lock:a redlockd:fence redlockd:marker redlockd:names
--          redlockd:shared:a redlockd:claim:a Zm9v 30000 worker-1 a redlockd:lock: w
--          redlockd:reader:a/ 5000 0
-- Returns {1, token} when granted (or, with a key, when this lease holds it already: its
-- token, the hold made to last the TTL from now as a renew would), {0, pttl_ms, lease} when another lease holds the lock ('shared' for shared
-- holders, pttl_ms the longest of theirs), {-1} when the marker is
-- missing (the master must not vote), {-2} when the key was used with another fingerprint,
-- {-3} when the key's lease held the lock here and has ended, {-4, pttl_ms} while an ended
-- lease's lock-delay lasts.
local keyed = #KEYS == 7 and #ARGV == 11
if not keyed and (#KEYS ~= 6 or #ARGV ~= 9) then
  return redis.error_reply('acquire expects 6 keys and 9 arguments, or 7 and 11')
end
if not marked(KEYS[3]) then return {-1} end
-- Nothing at the name (no hold, claim or shared holders) is the common case: one call
-- tells it, and the checks below are for the rest.
local busy = keyed or redis.call('EXISTS', KEYS[1], KEYS[6], KEYS[5]) > 0
local record, ended
if busy then
  record = keyed and redis.call('GET', KEYS[7])
  if record and record ~= ARGV[10] then
    return {-2}
  end
  local waiting = string.find(ARGV[6], 'w', 1, true)
  local held = redis.call('HMGET', KEYS[1], 'lease', 'token')
  if held[1] then
    if keyed and held[1] == ARGV[1] then
      redis.call('HSET', KEYS[1], 'seen', ARGV[11])
      -- The retry is answered a validity counted from now: the hold (and the key's record)
      -- must last its TTL from now here, as a renew would make it. A hold through a session
      -- lives as its session does; the grant attaches it again and answers that.
      local terms = redis.call('HMGET', KEYS[1], 'session', 'delay')
      local ttl = tonumber(ARGV[2])
      if not terms[1] and redis.call('PTTL', KEYS[1]) < ttl then
        redis.call('PEXPIRE', KEYS[1], ttl)
        redis.call('PEXPIRE', KEYS[7], ttl)
        if terms[2] then
          redis.call('SET', KEYS[6], 'd:' .. ARGV[1], 'PX', ttl + tonumber(terms[2]))
        end
      end
      return {1, tonumber(held[2])}
    end
    if waiting then
      redis.call('HSET', KEYS[1], 'waited', '1', 'single', '1')
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then pttl = 0 end
    return {0, pttl, held[1]}
  end
  -- A waiting several-name grant's claim (acquire_many.lua, 'g:...'): wait behind it; an
  -- ended lease's lock-delay ('d:...'): refused until it lapses.
  local claimed = redis.call('GET', KEYS[6])
  local claim_kind = claimed and string.sub(claimed, 1, 2)
  if claim_kind == 'g:' or claim_kind == 'd:' then
    local pttl = redis.call('PTTL', KEYS[6])
    if pttl < 0 then pttl = 0 end
    if claim_kind == 'd:' then return {-4, pttl} end
    if waiting then met(KEYS[6], claimed) end
    return {0, pttl, (string.gsub(claimed, ' w$', ''))}
  end
  if redis.call('EXISTS', KEYS[5]) == 1 then
    local readers, longest = 0, 0
    for _, reader in ipairs(redis.call('SMEMBERS', KEYS[5])) do
      local pttl = redis.call('PTTL', ARGV[7] .. reader)
      if pttl == -2 then
        redis.call('SREM', KEYS[5], reader)
      else
        readers = readers + 1
        if pttl > longest then longest = pttl end
        if waiting then redis.call('HSET', ARGV[7] .. reader, 'waited', '1') end
      end
    end
    if readers > 0 then
      local lasts = math.min(longest + 1000, tonumber(ARGV[8]) + 100)
      if waiting and redis.call('PTTL', KEYS[6]) < lasts then
        local was = redis.call('GET', KEYS[6])
        local mark = was and string.sub(was, -2) == ' w' and ' w' or ''
        redis.call('SET', KEYS[6], ARGV[1] .. mark, 'PX', lasts)
      end
      return {0, longest, 'shared'}
    end
  end
end
if record then
  return {-3}
end
if busy then ended = redis.call('GETDEL', KEYS[6]) end
local token = redis.call('INCR', KEYS[2])
local fields = {'lease', ARGV[1], 'token', token, 'ttl', ARGV[2], 'owner', ARGV[3]}
local function field(name, value)
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
if (ended and string.sub(ended, -2) == ' w') or string.find(ARGV[6], 'a', 1, true) then
  field('waited', '1')
end
if string.find(ARGV[6], 'o', 1, true) then
  field('observed', '1')
end
local delay = tonumber(ARGV[9]) or 0
if delay > 0 then
  field('delay', ARGV[9])
end
if keyed then
  field('idem', KEYS[7])
  field('made', ARGV[11])
  field('seen', ARGV[11])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if delay > 0 then
  redis.call('SET', KEYS[6], 'd:' .. ARGV[1], 'PX', tonumber(ARGV[2]) + delay)
end
if keyed then
  redis.call('SET', KEYS[7], ARGV[10], 'PX', ARGV[2])
end
indexed(KEYS[4], ARGV[4], ARGV[5])
return {1, token}
