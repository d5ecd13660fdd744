-- Removes every key and index entry of each expired task still due. A
-- task whose record exists again was re-created under the same id (a
-- keyed start after the old one expired): only the old one's leftovers go.
--
-- KEYS[1]: the partition's expiring tasks
-- KEYS[2 + 8 * (i - 1)..]: per task i, its record, fence counter,
--   cancellation flag, claimed attempts, lock, the saga's index of all its
--   tasks, the saga's index of the status it expired in, its audit log
-- ARGV[3 * (i - 1) + 1..]: per task i, its member of KEYS[1], its id, the
--   status it expired in (`TaskStatus::as_str`)
-- Returns: how many tasks were removed.
local expiring = KEYS[1]
local KEYS_PER_TASK = 8

local now = server_time()
local n = 0
for i = 1, #ARGV / 3 do
  local member, id, old = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local score = redis.call('ZSCORE', expiring, member)
  local k = 1 + (i - 1) * KEYS_PER_TASK
  local task_key, fence_key, cancel_key = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local claims_key, lock_key, index_all = KEYS[k + 4], KEYS[k + 5], KEYS[k + 6]
  local index_old, audit_key = KEYS[k + 7], KEYS[k + 8]
  if score and tonumber(score) <= now then
    local status = redis.call('HGET', task_key, 'status')
    local ttl = redis.call('PTTL', task_key)
    if status and status == old and ttl >= 0 then
      -- Due by the score but not expired yet (the two clocks may differ
      -- by a millisecond; `PTTL` answers 0 in the record's last
      -- millisecond): come back once it has, or the index entries would
      -- outlive the record.
      redis.call('ZADD', expiring, now + ttl + 1, member)
    else
      if status then
        if status ~= old then redis.call('ZREM', index_old, id) end
      else
        redis.call('DEL', task_key, fence_key, cancel_key, claims_key, lock_key, audit_key)
        redis.call('ZREM', index_all, id)
        redis.call('ZREM', index_old, id)
        n = n + 1
      end
      redis.call('ZREM', expiring, member)
    end
  end
end
return n
