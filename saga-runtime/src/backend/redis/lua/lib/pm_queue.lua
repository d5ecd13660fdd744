-- Process-manager partitions are written only while an engine reads them
-- (`members` has an entry live at `now`): until then, during a rolling
-- deploy from a version without partitions, messages go to the shared
-- stream that every version reads. The spread layout (a cluster) has no
-- such past, and its members live in another slot: its scripts are given
-- no `members` key (nil), and always write the partitions.
local function partitioned(members, now)
  if members == nil then return true end
  return redis.call('ZCOUNT', members, now, '+inf') > 0
end

-- The queue to write for partition queue `q`: itself while partitions are
-- written (`yes`), else the shared stream.
local function pm_queue(q, yes)
  if yes then return q end
  return (string.gsub(q, ':%d+$', ''))
end
