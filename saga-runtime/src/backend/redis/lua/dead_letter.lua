-- Parks a delivered message as a dead letter and settles it (settle.lua).
--
-- KEYS[1]: the queue
-- KEYS[2]: the queue's dead letters
-- ARGV[1]: the consumer group
-- ARGV[2]: the entry id
-- ARGV[3]: the payload (cut to the dead-letter payload limit)
-- ARGV[4]: the reason
-- ARGV[5]: the task id ('' = none)
-- ARGV[6]: the payload's size before it was cut ('' = not cut)
-- ARGV[7]: the dead letters' cap (`MAXLEN ~`)
-- Returns: the dead letter's entry id.
local queue = KEYS[1]
local dead = KEYS[2]
local group = ARGV[1]
local entry = ARGV[2]
local payload = ARGV[3]
local reason = ARGV[4]
local task = ARGV[5]
local size = ARGV[6]
local dead_cap = ARGV[7]

local now = server_time()
local fields = {'payload', payload, 'reason', reason, 'task', task, 'at', now}
if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
-- The letter first: if Redis refuses it, the message is still pending.
local id = redis.call('XADD', dead, 'MAXLEN', '~', dead_cap, '*', unpack(fields))
settle(queue, group, entry)
return id
