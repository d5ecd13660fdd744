-- Balances the process-manager partitions over the live members (sorted
-- by name, member `r` of `n` gets the partitions `k` with `k % n == r`):
-- takes or renews those of the member that are free or its own, lets go
-- of its others (their new owner takes them on its next call) once it
-- has no message of theirs in flight (until then it keeps them, without
-- reading them: the new owner must not handle an instance's next message
-- while the old one still handles the previous), and
-- returns the partitions it holds now, as a list (a bit mask built in
-- Lua, whose numbers are doubles, would lose partitions past 53). Leaving
-- lets go of the membership and of the partitions but the busy ones. A partition is never held
-- by two members: an owner lease is taken only where none is. The owner
-- also moves its partitions' due hand-backs back onto them (as the timer
-- poller does, move_due.lua): a poller of a version without partitions
-- would not.
--
-- KEYS[1]: the partition members (by when each membership runs out)
-- ARGV[1]: the owner leases' prefix (partition k's is `<prefix>:<k>`)
-- ARGV[2]: the member
-- ARGV[3]: its time to live (ms)
-- ARGV[4]: how many partitions
-- ARGV[5]: '1' if it is leaving
-- ARGV[6]: the process-manager key prefix ('' in the spread layout, whose
--   partitions are in other slots: the timer poller moves their due
--   hand-backs)
-- ARGV[7]: the partitions the member keeps though not its share (it
--   still has messages of them in flight), comma-separated ('' for none)
-- Returns: the partitions the member holds, as a list.
local members_key = KEYS[1]
local owner_prefix = ARGV[1]
local me = ARGV[2]
local ttl = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local leaving = ARGV[5]
local pm_prefix = ARGV[6]
local busy_list = ARGV[7]

local busy = {}
for k in string.gmatch(busy_list, '%d+') do busy[tonumber(k)] = true end

local now = server_time()
redis.call('ZREMRANGEBYSCORE', members_key, '-inf', now)
local rank, size = -1, 0
if leaving == '1' then
  redis.call('ZREM', members_key, me)
else
  redis.call('ZADD', members_key, now + ttl, me)
  local members = redis.call('ZRANGE', members_key, 0, -1)
  table.sort(members)
  size = #members
  for i, m in ipairs(members) do if m == me then rank = i - 1 end end
end
local owned = {}
for k = 0, n - 1 do
  local key = owner_prefix .. ':' .. k
  local owner = redis.call('GET', key)
  if rank >= 0 and k % size == rank then
    if not owner or owner == me then
      redis.call('SET', key, me, 'PX', ttl)
      owned[#owned + 1] = k
      if pm_prefix ~= '' then
        move_due(pm_prefix .. ':delayed:' .. k, pm_prefix .. ':queue:' .. k, 256, now)
      end
    end
  elseif owner == me and busy[k] then
    redis.call('SET', key, me, 'PX', ttl)
  elseif owner == me then
    redis.call('DEL', key)
  end
end
return owned
