-- Sends a tally's completion if every item is checked and it has not been
-- sent: called by a check that took an item and saw none left, by a later
-- check that finds it unsent (the first one died between its check and
-- this), and by housekeeping.
--
-- KEYS[1]: the tally (a hash: total, done, late, sent_by, completion,
--   completion_late)
-- KEYS[2]: its unchecked items
-- KEYS[3]: its checked items
-- KEYS[4]: the process-manager queue of the instance's partition
-- KEYS[5]: the partition's open tallies
-- KEYS[6]: the partition members (compact layout only; pm_queue.lua)
-- ARGV[1]: how long a completed tally is kept (ms)
-- ARGV[2]: the tally's member of KEYS[5]
-- ARGV[3]: who calls: 'mover' (a check that moved an item and saw none
--   left) or 'repair'
-- Returns: 1 sent now (or, to the first mover after a repair sent it,
-- sent for it), 0 not (yet), GONE (-1) no such tally.
local tally = KEYS[1]
local pending = KEYS[2]
local checked = KEYS[3]
local queue = KEYS[4]
local open = KEYS[5]
local members = KEYS[6]
local keep = ARGV[1]
local member = ARGV[2]
local caller = ARGV[3]
local GONE = -1

local now = server_time()
if redis.call('EXISTS', tally) == 0 then
  redis.call('ZREM', open, member)
  return GONE
end
if redis.call('HGET', tally, 'done') == '1' then
  redis.call('ZREM', open, member)
  -- Sent by a check that moved no item (a repair racing the mover of the
  -- last one): that mover completed it, once.
  if caller == 'mover' and redis.call('HGET', tally, 'sent_by') == 'repair' then
    redis.call('HSET', tally, 'sent_by', 'claimed')
    return 1
  end
  return 0
end
if redis.call('SCARD', pending) > 0 then return 0 end
local late = redis.call('HGET', tally, 'late') == '1'
local completion = redis.call('HGET', tally, late and 'completion_late' or 'completion')
redis.call('XADD', pm_queue(queue, partitioned(members, now)), '*', 'payload', completion)
redis.call('HSET', tally, 'done', 1, 'sent_by', caller)
for _, k in ipairs({tally, pending, checked}) do
  local ttl = redis.call('PTTL', k)
  if ttl == -1 or ttl > tonumber(keep) then redis.call('PEXPIRE', k, keep) end
end
redis.call('ZREM', open, member)
return 1
