-- list: one page of held locks, in name order, from the index of names.
--
-- Every grant adds its name to a sorted set (score 0, ordered by name), so locks can be
-- paged in name order without SCAN (which has no order and cannot resume by name).
-- Releases leave their names (see acquire.lua); names whose lock has ended are removed as
-- they are met. The page
-- stops at `limit` live locks or after `budget` names examined, so a large keyspace never
-- makes one call long.
--
-- KEYS[1] the index of names, KEYS[2] the marker
-- ARGV[1] the lock key prefix, ARGV[2] list names after this one ('' from the start),
-- ARGV[3] only names starting with this, ARGV[4] limit, ARGV[5] budget
--
-- Example: EVALSHA <sha> 2 redlockd:names redlockd:marker redlockd:lock: inv:41 inv 100 1000
-- Returns {more, last, name, lease, token, ttl_ms, pttl_ms, owner, name, ...}: `more` is 1
-- when names past `last` (the last name examined) were not looked at; {-1} when the marker
-- is missing.
if #KEYS ~= 2 or #ARGV ~= 5 then
  return redis.error_reply('list expects 2 keys and 5 arguments')
end
-- A master in a data layout this release does not know is refused, never written or
-- misread (layout.lua, put before this file, then prelude.lua, whose `row` this uses).
local refused = layout_refused(redis.call('GET', KEYS[2] .. ':layout'))
if refused then return redis.error_reply(refused) end
if redis.call('EXISTS', KEYS[2]) == 0 then return {-1} end
local after, prefix = ARGV[2], ARGV[3]
local limit, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local lower = '[' .. prefix
if after ~= '' and after >= prefix then
  lower = '(' .. after
end
-- Names are ASCII below 0x7f, so every name starting with `prefix` sorts below this.
local upper = '[' .. prefix .. '\255'
local out = {0, after}
local found, examined = 0, 0
while found < limit and examined < budget do
  local batch = math.min(limit - found, budget - examined, 200)
  local names = redis.call('ZRANGE', KEYS[1], lower, upper, 'BYLEX', 'LIMIT', 0, batch)
  if #names == 0 then
    return out
  end
  for _, name in ipairs(names) do
    examined = examined + 1
    if row(out, name, ARGV[1] .. name) then
      found = found + 1
    else
      redis.call('ZREM', KEYS[1], name)
    end
    out[2] = name
    lower = '(' .. name
  end
end
if #redis.call('ZRANGE', KEYS[1], lower, upper, 'BYLEX', 'LIMIT', 0, 1) > 0 then
  out[1] = 1
end
return out
