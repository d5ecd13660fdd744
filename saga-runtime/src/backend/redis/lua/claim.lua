-- Takes over messages whose consumer stopped settling them (its worker
-- died), from the first queue that has any. Entries deleted from the
-- stream are dropped from the pending list. The fields are returned raw:
-- an entry that does not decode is the caller's to dead-letter, without
-- holding the others up.
--
-- KEYS[1..]: the queues (of one slot)
-- ARGV[1]: the consumer group
-- ARGV[2]: the consumer
-- ARGV[3]: how long a message must have been idle (ms)
-- ARGV[4]: at most this many messages per queue
-- Returns: a list of {queue index (from 0), entry id, delivery count (this
-- one included), fields}.
local group = ARGV[1]
local consumer = ARGV[2]
local min_idle = ARGV[3]
local count = ARGV[4]

local out = {}
for s = 1, #KEYS do
  local pending = redis.call('XPENDING', KEYS[s], group, 'IDLE', min_idle, '-', '+', count)
  for _, p in ipairs(pending) do
    local claimed = redis.call('XCLAIM', KEYS[s], group, consumer, min_idle, p[1])
    if #claimed == 0 or not claimed[1][2] then
      redis.call('XACK', KEYS[s], group, p[1])
    else
      out[#out + 1] = {s - 1, p[1], p[4] + 1, claimed[1][2]}
    end
  end
  if #out > 0 then return out end
end
return out
