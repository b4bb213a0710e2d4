-- slots: which slots of a semaphore below a limit are held on this master, and by whom.
--
-- A semaphore's slot `i` is a lock hash of its own, `<slot key prefix><i>` (see
-- acquire.lua); a grant of a permit reads them here, in one step, before it takes a free
-- one. Slots at or above the limit are not looked at: the grant may not take them.
--
-- KEYS[1] the marker
-- ARGV[1] the semaphore's slot key prefix (e.g. redlockd:semaphore:db-pool/), ARGV[2] the
-- limit (1 to 1000)
--
-- Example: EVALSHA <sha> 1 redlockd:marker redlockd:semaphore:db-pool/ 3
-- Returns {1, slot, lease, token, ttl_ms, pttl_ms, owner, slot, ...} for the held slots, in
-- slot order, or {-1} when the marker is missing.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('slots expects 1 key and 2 arguments')
end
if not marked(KEYS[1]) then return {-1} end
local limit = tonumber(ARGV[2])
if not limit or limit < 1 or limit > 1000 then
  return redis.error_reply('slots: the limit must be from 1 to 1000')
end
local out = {1}
for slot = 0, limit - 1 do
  row(out, slot, ARGV[1] .. slot)
end
return out
