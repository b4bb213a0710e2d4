-- prelude: what the steps of a batch share, defined once before them (store/batch.rs puts
-- layout.lua and this file first, the steps after them, then batch.lua; list.lua, which
-- runs as a call of its own, has it after layout.lua too).
--
-- marked(key): whether this master still has its marker (gone = it lost its data, and it
-- must not vote: store/health). Every step asks it first. The first step of a batch that
-- asks about a marker key asks the master; the others reuse the answer. No step creates or
-- deletes a marker (restore.lua and unmark.lua run as calls of their own, never in a
-- batch) and a script runs alone on the master, so the answer cannot change before the
-- batch ends. An EXISTS per step was about 3.5 % of a batched grant + release inside
-- Redis (docs/performance.md).
--
-- The same read asks which data layout the master keeps (`<marker>:layout`, layout.lua):
-- a step of this release on a master in a layout it does not know fails with a LAYOUT
-- error.
local markers = {}
local function marked(key)
  local known = markers[key]
  if known == nil then
    local found = redis.call('MGET', key, key .. ':layout')
    local refused = layout_refused(found[2])
    if refused then error(redis.error_reply(refused)) end
    known = found[1] ~= false
    markers[key] = known
  end
  return known
end

-- met(key, claim): a waiting grant met another's claim (the value `claim` of `key`): mark
-- it (its value then ends in ' w', kept while it lasts), so that the grant that ends the
-- claim by taking the name wakes the waiter (see acquire.lua and acquire_many.lua).
local function met(key, claim)
  if string.sub(claim, -2) ~= ' w' then
    local left = redis.call('PTTL', key)
    if left > 0 then redis.call('SET', key, claim .. ' w', 'PX', left) end
  end
end

-- opener(stream): the tag of the token that opened a held stream, from the stream's name
-- on the masters ('<opener>/<random>'; '' for a name without '/'): see renew.lua.
local function opener(stream)
  return string.match(stream, '^([^/]*)/') or ''
end

-- indexed(index, member, prefix): add `member` to `index`, a sorted set of names (score 0,
-- in name order); when it was not there, look at two sampled members and remove those
-- whose key (`prefix` .. member) is gone. So names whose hold has ended stay a bounded
-- share of the index (about half at worst) without a sweep (see acquire.lua). With no
-- prefix (''), nothing: a Redis Cluster master keeps no index of names.
local function indexed(index, member, prefix)
  if prefix ~= '' and redis.call('ZADD', index, '0', member) == 1 then
    for _, stale in ipairs(redis.call('ZRANDMEMBER', index, 2)) do
      if redis.call('EXISTS', prefix .. stale) == 0 then
        redis.call('ZREM', index, stale)
      end
    end
  end
end

-- row(out, label, key): when the lock hash `key` is held, append its row to `out`
-- (label, lease, token, TTL in ms, time left in ms, owner) and answer true (list.lua and
-- slots.lua answer these rows).
local function row(out, label, key)
  local f = redis.call('HMGET', key, 'lease', 'token', 'ttl', 'owner')
  if not f[1] then return false end
  local pttl = redis.call('PTTL', key)
  if pttl < 0 then pttl = 0 end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = label, f[1], tonumber(f[2])
  out[n + 4], out[n + 5], out[n + 6] = tonumber(f[3]), pttl, f[4] or ''
  return true
end
