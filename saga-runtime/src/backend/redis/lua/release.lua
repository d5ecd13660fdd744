-- Hands a message back: if it is still pending for this consumer, it is
-- acknowledged and a copy of its payload is enqueued now (or put on the
-- delayed set), carrying its count of unanswered deliveries.
--
-- An entry with no `payload` field has nothing a copy could carry: it is
-- left pending, untouched, and the answer says so, for the caller to
-- dead-letter it (dead_letter.lua parks and settles it in one step).
-- Settling it here would drop it unseen.
--
-- KEYS[1]: the queue
-- KEYS[2]: the queue's delayed messages
-- ARGV[1]: the consumer group
-- ARGV[2]: the consumer
-- ARGV[3]: the entry id
-- ARGV[4]: the delay (ms; '0' = enqueue now)
-- ARGV[5]: '1' if this delivery counts as answered
-- Returns: 1 if handed back, 0 if it was no longer ours (settled
-- meanwhile, or taken over by another consumer), 2 if it has no payload
-- (left pending).
local queue = KEYS[1]
local delayed = KEYS[2]
local group = ARGV[1]
local consumer = ARGV[2]
local entry = ARGV[3]
local delay = ARGV[4]
local answered = ARGV[5]

local now = server_time()
local ok, p = pcall(redis.call, 'XPENDING', queue, group, entry, entry, 1)
if not ok or #p == 0 or p[1][2] ~= consumer then return 0 end
local e = redis.call('XRANGE', queue, entry, entry)
if #e == 0 then
  -- Deleted meanwhile: nothing left to hand back or to lose.
  redis.call('XACK', queue, group, entry)
  return 0
end
local payload, carried = nil, 0
local f = e[1][2]
for i = 1, #f, 2 do
  if f[i] == 'payload' then payload = f[i + 1] end
  if f[i] == 'unanswered' then carried = tonumber(f[i + 1]) or 0 end
end
if not payload then return 2 end
redis.call('XACK', queue, group, entry)
redis.call('XDEL', queue, entry)
local unanswered = carried + tonumber(p[1][4])
if answered == '1' then unanswered = unanswered - 1 end
if delay == '0' then
  redis.call('XADD', queue, '*', 'payload', payload, 'unanswered', unanswered)
else
  redis.call('ZADD', delayed, now + tonumber(delay), unanswered .. ':' .. payload)
end
return 1
