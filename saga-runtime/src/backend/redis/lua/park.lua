-- Parks a message that never was on the queue (a broker delivery that is
-- not a message) as a dead letter.
--
-- KEYS[1]: the dead letters
-- ARGV[1]: the payload (cut to the dead-letter payload limit)
-- ARGV[2]: the reason
-- ARGV[3]: the payload's size before it was cut ('' = not cut)
-- ARGV[4]: the dead letters' cap (`MAXLEN ~`)
-- Returns: the dead letter's entry id.
local dead = KEYS[1]
local payload = ARGV[1]
local reason = ARGV[2]
local size = ARGV[3]
local dead_cap = ARGV[4]

local fields = {'payload', payload, 'reason', reason, 'task', '', 'at', server_time()}
if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
return redis.call('XADD', dead, 'MAXLEN', '~', dead_cap, '*', unpack(fields))
