-- marked: whether this master still has its marker (gone = it lost its data, and it must
-- not vote: store/health). Every step asks it first.
--
-- Defined once before the steps of a batch (store/batch.rs puts this file first), as a
-- function the steps call: the first step of a batch that asks about a marker key asks the
-- master, the others reuse the answer. No step creates or deletes a marker (restore.lua
-- and unmark.lua run as calls of their own, never in a batch) and a script runs alone on
-- the master, so the answer cannot change before the batch ends. An EXISTS per step was
-- about a tenth of what a batch of grants and releases cost inside Redis.
local markers = {}
local function marked(key)
  local known = markers[key]
  if known == nil then
    known = redis.call('EXISTS', key) == 1
    markers[key] = known
  end
  return known
end
