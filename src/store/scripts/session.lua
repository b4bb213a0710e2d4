-- session: one heartbeat for many holds. A session is a hash on each master
-- (e.g. redlockd:session:<id>) with its TTL ('ttl'), its owner text ('owner') and, for each
-- hold made through it, a field 'h:<lease id>' whose value says what the hold is and which
-- keys carry it, one line each:
--   '<kind> <token> <key name>'  first: what GET /sessions/{id} lists, and what ending the
--                                session releases (kind and key name as the lock key's)
--   'k <key>'                    a key the lease holds (a lock hash, a shared hold's hash,
--                                a permit's slot, each name of a several-name lease)
--   'c <key>'                    the name's claim, where a lock-delay is kept (acquire.lua)
--   's <key>'                    the set of shared holders, which lives as long as the hold
-- A hold's keys expire with the session: attaching sets their TTL to what is left of the
-- session and marks them ('session' in the hash: renew.lua then leaves them alone), and a
-- renew of the session extends the session and every key of every hold in one call. So a
-- hold lives exactly as long as its session on each master, however many holds there are,
-- and a session that ends or expires takes its holds with it.
--
-- On a Redis Cluster master a session is a record per hash slot: its home (in the slot of
-- its id) and one in each slot its holds live in (beside them, so that every key one call
-- touches is in one slot). The home lists those slots ('s:<slot>' fields); its renew,
-- read and end answer them ('@<slot>'), and the caller takes the same step on each.
--
-- KEYS[1] the session hash, KEYS[2] the marker; for 'attach', then the hold's keys as its
-- lines name them.
-- ARGV[1] the operation:
--   'open' ttl owner            make the session (its TTL and owner text)
--   'renew' ttl                 extend it and its holds ('' keeps its TTL)
--   'renew' ttl stream          the same, and the held stream `stream` keeps it from now
--                               on (a resume: 'stream' in the hash, a home record's only)
--   'read'                      what it is and holds
--   'end'                       delete it; answers its holds (the caller releases them)
--   'end' stream                the same, only while the held stream `stream` keeps it
--                               ('' for the stream that opened it); else {3}, and nothing
--                               is done (its holder resumed it through another stream)
--   'attach' lease entry        add the hold `lease` described by `entry` (its lines): its
--                               keys named with 'k' that the lease holds are given what is
--                               left of the session, and its lock-delay claim moves along
--   'attach' lease entry pttl ttl owner
--                               the same in a cluster's slot record, made first when
--                               missing (what is left of the session, its TTL and owner)
--   'note' slot                 list a slot a hold lives in (a cluster's home record)
--
-- Example: EVALSHA <sha> 2 redlockd:session:Zm9v redlockd:marker renew 30000
-- Returns {-1} when the marker is missing, {0} when the session does not exist here, {2}
-- when an attached hold is not held here (its grant did not reach this master), else
-- {1, pttl_ms, ttl_ms, owner, holds...} where holds are '<lease>\n<entry>' each ('read',
-- only those whose keys are still their own here, and 'end', all of them); 'renew' answers
-- the lease ids of the holds it carried instead, '!<lease>' for each hold it found gone
-- here (and took off the session), and '=<stream>' for the held stream that keeps the
-- session ('=' alone: the one that opened it, or none); the others nothing. A renew's caller counts, for
-- each hold, the masters that carried it and those that have the session without it: a hold
-- carried by a majority of all masters is kept, one denied by a majority has ended, and any
-- other (a carrier did not answer) is unconfirmed and left where it is.
if #KEYS < 2 or #ARGV < 1 then
  return redis.error_reply('session expects 2 keys or more and an operation')
end
if not marked(KEYS[2]) then return {-1} end
local op = ARGV[1]
local session = KEYS[1]

if op == 'attach' and #ARGV == 6 and redis.call('EXISTS', session) == 0 then
  redis.call('HSET', session, 'ttl', ARGV[5], 'owner', ARGV[6])
  redis.call('PEXPIRE', session, ARGV[4])
end

if op == 'open' then
  if #ARGV ~= 3 then return redis.error_reply('session open expects ttl and owner') end
  redis.call('HSET', session, 'ttl', ARGV[2], 'owner', ARGV[3])
  redis.call('PEXPIRE', session, ARGV[2])
  return {1, tonumber(ARGV[2]), tonumber(ARGV[2]), ARGV[3]}
end

local fields = redis.call('HMGET', session, 'ttl', 'owner')
if not fields[1] then return {0} end

-- Each line of a hold's entry, as {tag, rest}.
local function lines(entry)
  local out = {}
  for line in string.gmatch(entry, '[^\n]+') do
    local sp = string.find(line, ' ', 1, true)
    if sp then out[#out + 1] = {string.sub(line, 1, sp - 1), string.sub(line, sp + 1)} end
  end
  return out
end

-- Give the hold `lease` described by `entry` `ttl` ms more, as renew.lua would; false
-- when none of its keys is still its own here (it ended: revoked, or released elsewhere).
local function extend(lease, entry, ttl)
  local live, delay = false, nil
  for i, line in ipairs(lines(entry)) do
    local tag, key = line[1], line[2]
    if i > 1 and tag == 'k' then
      local held = redis.call('HMGET', key, 'lease', 'delay')
      if held[1] == lease then
        live = true
        delay = held[2] or delay
        redis.call('PEXPIRE', key, ttl)
      end
    elseif tag == 'c' and live and delay then
      redis.call('SET', key, 'd:' .. lease, 'PX', ttl + tonumber(delay))
    elseif tag == 's' and live and redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
  end
  return live
end

-- Whether any key of the hold `lease` described by `entry` is still its own here.
local function alive(lease, entry)
  for i, line in ipairs(lines(entry)) do
    if i > 1 and line[1] == 'k' and redis.call('HGET', line[2], 'lease') == lease then
      return true
    end
  end
  return false
end

local answer = {1, redis.call('PTTL', session), tonumber(fields[1]), fields[2] or ''}

if op == 'note' then
  if #ARGV ~= 2 then return redis.error_reply('session note expects a slot') end
  redis.call('HSET', session, 's:' .. ARGV[2], '1')
  return answer
end

if op == 'renew' then
  local ttl = tonumber(ARGV[2] ~= '' and ARGV[2] or fields[1])
  if ARGV[2] ~= '' then redis.call('HSET', session, 'ttl', ttl) end
  if ARGV[3] and ARGV[3] ~= '' then redis.call('HSET', session, 'stream', ARGV[3]) end
  redis.call('PEXPIRE', session, ttl)
  local all = redis.call('HGETALL', session)
  answer[2], answer[3] = ttl, ttl
  answer[5] = '=' .. (redis.call('HGET', session, 'stream') or '')
  for i = 1, #all, 2 do
    local field = all[i]
    if string.sub(field, 1, 2) == 'h:' then
      if extend(string.sub(field, 3), all[i + 1], ttl) then
        answer[#answer + 1] = string.sub(field, 3)
      else
        redis.call('HDEL', session, field)
        answer[#answer + 1] = '!' .. string.sub(field, 3)
      end
    elseif string.sub(field, 1, 2) == 's:' then
      answer[#answer + 1] = '@' .. string.sub(field, 3)
    end
  end
  return answer
end

if op == 'end' and ARGV[2] and (redis.call('HGET', session, 'stream') or '') ~= ARGV[2] then
  return {3}
end

if op == 'read' or op == 'end' then
  local all = redis.call('HGETALL', session)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'h:' then
      -- 'read' lists only holds that still exist here; 'end' releases all it lists.
      if op == 'end' or alive(string.sub(all[i], 3), all[i + 1]) then
        answer[#answer + 1] = string.sub(all[i], 3) .. '\n' .. all[i + 1]
      end
    elseif string.sub(all[i], 1, 2) == 's:' then
      answer[#answer + 1] = '@' .. string.sub(all[i], 3)
    end
  end
  if op == 'end' then redis.call('DEL', session) end
  return answer
end

if op == 'attach' then
  if #ARGV ~= 3 and #ARGV ~= 6 then
    return redis.error_reply('session attach expects lease and entry (and pttl, ttl, owner)')
  end
  local lease, entry = ARGV[2], ARGV[3]
  local pttl = redis.call('PTTL', session)
  if pttl <= 0 then return {0} end
  local live = false
  for i, line in ipairs(lines(entry)) do
    if i > 1 and line[1] == 'k' and redis.call('HGET', line[2], 'lease') == lease then
      live = true
      redis.call('HSET', line[2], 'session', '1', 'ttl', fields[1])
      redis.call('PEXPIRE', line[2], pttl)
    end
  end
  -- The hold did not reach this master (or is gone): nothing to carry here.
  if not live then return {2} end
  redis.call('HSET', session, 'h:' .. lease, entry)
  extend(lease, entry, pttl)
  return answer
end

return redis.error_reply('session: unknown operation ' .. op)
