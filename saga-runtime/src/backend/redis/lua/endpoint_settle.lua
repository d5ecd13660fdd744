-- Acknowledges an endpoint's message, parking it first as a dead letter
-- when asked.
--
-- KEYS[1]: the endpoint's stream
-- KEYS[2]: its dead letters
-- ARGV[1]: the consumer group
-- ARGV[2]: the entry id
-- ARGV[3]: '1' to park it as a dead letter
-- ARGV[4]: the dead letter's payload
-- ARGV[5]: the dead letter's reason
-- ARGV[6]: the payload's size before it was cut ('' = not cut)
-- ARGV[7]: the dead letters' cap (`MAXLEN ~`)
-- Returns: 1 if it was pending, else 0.
local stream = KEYS[1]
local dead = KEYS[2]
local group = ARGV[1]
local entry = ARGV[2]
local park = ARGV[3]
local payload = ARGV[4]
local reason = ARGV[5]
local size = ARGV[6]
local dead_cap = ARGV[7]

local now = server_time()
if park == '1' then
  local fields = {'payload', payload, 'reason', reason, 'at', now}
  if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
  redis.call('XADD', dead, 'MAXLEN', '~', dead_cap, '*', unpack(fields))
end
local ok, n = pcall(redis.call, 'XACK', stream, group, entry)
if ok then return n end
return 0
