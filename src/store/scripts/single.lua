-- single: one step as a call of its own, answered as a batch of that one step would be.
--
-- A Redis Cluster's steps are not batched (a batch's keys would span hash slots: see
-- store/cluster.rs), so each is a call of its own. Sent through batch.lua it paid for a
-- batch anyway: every step's function defined, its keys and arguments copied into tables,
-- its answer nested. store/redis.rs puts layout.lua, prelude.lua and the one step's own
-- script (as the function `step`) before this file, one script per step, so that the
-- call passes KEYS and ARGV to it as they came.
--
-- KEYS, ARGV: the step's own, in the order its script's header lists them.
-- Returns what batch.lua returns for a batch of this one step: its answer (an error in its
-- place when the step's script fails), then the master's TIME (seconds, microseconds).
local replies = {}
local ok, answer = pcall(step, KEYS, ARGV)
if ok then
  replies[1] = answer
elseif type(answer) == 'table' and answer.err then
  replies[1] = answer
else
  replies[1] = redis.error_reply(tostring(answer))
end
replies[#replies + 1] = redis.call('TIME')
return replies
