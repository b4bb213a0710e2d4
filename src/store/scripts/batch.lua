-- batch: several steps on this master in one script call, each answered in order.
--
-- Concurrent requests' steps for one master travel together (see store/batch.rs): one
-- EVALSHA, one read and one write on the socket, for many acquires, confirms, renews,
-- releases and reads. Each step runs its own script (acquire.lua, release.lua, ...), which
-- store/redis.rs puts before this file as a function of that step's KEYS and ARGV in the
-- table `steps` (after prelude.lua, the functions the steps share); this file only deals
-- out the keys and arguments and collects the answers.
-- The step scripts still own the data layout, and a step's answer is exactly what its
-- script would have answered as a call of its own.
--
-- KEYS: every step's keys, step after step.
-- ARGV: for each step, its name, its number of keys, its number of arguments, then its
-- arguments.
--
-- Example (two reads): EVALSHA <sha> 4 redlockd:lock:a redlockd:marker redlockd:lock:b
--          redlockd:marker read 2 0 read 2 0
-- Returns one answer per step, in order, then the master's TIME (seconds, microseconds):
-- the engine watches every master's clock with it (store/clock.rs). A step whose script
-- fails (a wrong arity, a command error) answers that error in its place; the other steps
-- are unaffected.
--
-- A step's keys and arguments are each taken in one table built at its size (`unpack`):
-- filled one by one, a table grows by doubling, and those reallocations were about a third
-- of what dealing out cost (measured: docs/performance.md, "Inside Redis").
local replies = {}
local k, a, n = 1, 1, #ARGV
while a <= n do
  local name, nkeys, nargs = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not nkeys or not nargs then
    return redis.error_reply('batch: step ' .. (#replies + 1) .. ' has no key and argument counts')
  end
  local keys = {unpack(KEYS, k, k + nkeys - 1)}
  local args = {unpack(ARGV, a + 3, a + 2 + nargs)}
  k, a = k + nkeys, a + 3 + nargs
  local step = steps[name]
  local reply
  if not step then
    reply = redis.error_reply('batch: no step named ' .. tostring(name))
  else
    local ok, answer = pcall(step, keys, args)
    if ok then
      reply = answer
    elseif type(answer) == 'table' and answer.err then
      reply = answer
    else
      reply = redis.error_reply(tostring(answer))
    end
  end
  replies[#replies + 1] = reply
end
if k ~= #KEYS + 1 then
  return redis.error_reply('batch: the steps named ' .. (k - 1) .. ' keys, ' .. #KEYS .. ' were given')
end
replies[#replies + 1] = redis.call('TIME')
return replies
