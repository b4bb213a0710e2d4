-- layout: which data layout this release reads and writes, defined once for every script
-- that reads or writes what a master keeps (store/batch.rs puts it before prelude.lua in
-- the batch script; store/redis.rs puts it before restore.lua, unmark.lua, list.lua and
-- watermark.lua).
--
-- A master names its layout in `<marker>:layout` (in the marker's hash slot; none = layout
-- 1, what every release so far writes). A release that reads and writes the keys
-- differently will set another there; this release then refuses the master with a LAYOUT
-- error rather than misread or overwrite what that release wrote (the replica counts the
-- master as failing the call: store/node.rs, NodeError::Layout).
--
-- layout_refused(layout): the LAYOUT error's text for a master that names `layout` (the
-- value of its `<marker>:layout`, false when absent), or nil when this release knows it.
local LAYOUT = '1'
local function layout_refused(layout)
  if layout and layout ~= LAYOUT then
    return 'LAYOUT this master keeps data layout ' .. tostring(layout)
      .. ', which this release of redlockd does not know (it knows ' .. LAYOUT .. ')'
  end
  return nil
end
