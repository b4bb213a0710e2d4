-- held: one page of what this master holds, for the quarantine of another master that lost
-- its data (store/health: a quarantine as long as the holds that need it).
--
-- Every key of redlockd's with a time to live is a hold or part of one: a lock's hash, a
-- shared or several-name hold, a permit's slot, an election's term, a session, a kept hold,
-- a waiting grant's or a lock-delay's claim, an Idempotency-Key's record, and the keys any
-- later script adds. The keys without one (the fencing counter, the marker and its records,
-- the indexes of names) are not. Each is answered with what names its holder here: a
-- hash's 'lease', a string's value without a waiter's ' w' mark, '' for anything else (a
-- session's or a record's key is named by its id), and its time left by this master's
-- clock. Reading keys by a SCAN, not a record every script keeps, is what sees them all.
--
-- ARGV[1] the SCAN cursor ('0' to begin), ARGV[2] the pattern of redlockd's keys (its
-- prefix, escaped, then '*'), ARGV[3] how many keys SCAN looks at for this page
--
-- Example: EVALSHA <sha> 0 0 redlockd:* 500
-- Returns {next cursor ('0': done), key, holder, pttl_ms, key, holder, pttl_ms, ...}.
if #KEYS ~= 0 or #ARGV ~= 3 then
  return redis.error_reply('held expects 0 keys and 3 arguments')
end
local page = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local out = {page[1]}
for _, key in ipairs(page[2]) do
  local pttl = redis.call('PTTL', key)
  if pttl > 0 then
    local kind = redis.call('TYPE', key)['ok']
    local holder = ''
    if kind == 'hash' then
      holder = redis.call('HGET', key, 'lease') or ''
    elseif kind == 'string' then
      holder = redis.call('GET', key) or ''
      if string.sub(holder, -2) == ' w' then holder = string.sub(holder, 1, -3) end
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3] = key, holder, pttl
  end
end
return out
