-- Holds a continuing process-manager message that found no instance,
-- until one exists (`ProcessCommit::hold`), and settles its delivery: all
-- after the checks that the instance (or the correlation entry) it looks
-- for still does not exist, that no tombstone there remembers it, and
-- that fewer than the cap are held for the value. A message held for the
-- value already (its id) is not held twice.
--
-- KEYS[1]: what the message looks for: the instance (a hash) or the
--   correlation entry (its owner's id)
-- KEYS[2]: the tombstone of that instance or entry
-- KEYS[3]: the held ids of the value (a list, in order)
-- KEYS[4]: their payloads (a hash by id)
-- KEYS[5]: the partition's schedule
-- KEYS[6]: the queue of the delivery
-- ARGV[1]: the message id
-- ARGV[2]: the message as held (its schedule member)
-- ARGV[3]: when its hold ends (ms since the epoch)
-- ARGV[4]: the cap
-- ARGV[5]: how to settle the delivery: 'none' or 'ack'
-- ARGV[6]: its entry id
-- ARGV[7]: the consumer group
-- Returns: {0} held, {1} held already, or a refusal: {CONFLICT} the
-- instance or entry exists ({TAKEN, owner} for an entry), {TOMBSTONED}, {HOLD_FULL, n}.
local owner_key = KEYS[1]
local tombstone = KEYS[2]
local list = KEYS[3]
local hash = KEYS[4]
local schedule = KEYS[5]
local queue = KEYS[6]
local message_id = ARGV[1]
local payload = ARGV[2]
local until_ms = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local settle_kind = ARGV[5]
local entry = ARGV[6]
local group = ARGV[7]

local kind = redis.call('TYPE', owner_key)['ok']
if kind == 'string' then return {TAKEN, redis.call('GET', owner_key)} end
if kind ~= 'none' then return {CONFLICT} end
if redis.call('SISMEMBER', tombstone, message_id) == 1 then return {TOMBSTONED} end
local answer = 0
if redis.call('HEXISTS', hash, message_id) == 1 and redis.call('ZSCORE', schedule, redis.call('HGET', hash, message_id)) then
  answer = 1
else
  local held = held_now(list, hash, schedule)
  if #held >= cap then return {HOLD_FULL, #held} end
  redis.call('RPUSH', list, message_id)
  redis.call('HSET', hash, message_id, payload)
  redis.call('ZADD', schedule, until_ms, payload)
  -- The index outlives the last hold it keeps by a minute.
  local keep = math.max(until_ms - server_time(), 0) + 60000
  for _, k in ipairs({list, hash}) do
    if redis.call('PTTL', k) < keep then redis.call('PEXPIRE', k, keep) end
  end
end
if settle_kind == 'ack' then settle(queue, group, entry) end
return {answer}
