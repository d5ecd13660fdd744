-- Takes a message of an endpoint for a consumer without blocking: one
-- another consumer has left untouched long enough first (found anywhere
-- in the group's pending list, as claim.lua does), else a new one; creates
-- the group (from the oldest message kept) if it does not exist.
--
-- KEYS[1]: the endpoint's stream
-- ARGV[1]: the consumer group
-- ARGV[2]: the consumer
-- ARGV[3]: how long a message must have been idle to be taken over (ms)
-- Returns: {entry id, fields, deliveries} or {}.
local stream = KEYS[1]
local group = ARGV[1]
local consumer = ARGV[2]
local claim_idle = ARGV[3]

local ok, pending = pcall(redis.call, 'XPENDING', stream, group, 'IDLE', claim_idle, '-', '+', 10)
if not ok then
  local why = type(pending) == 'table' and pending.err or tostring(pending)
  if not string.find(why, 'NOGROUP') then return redis.error_reply(why) end
  redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
  pending = {}
end
for _, p in ipairs(pending) do
  local claimed = redis.call('XCLAIM', stream, group, consumer, claim_idle, p[1])
  if #claimed == 0 or not claimed[1][2] then
    -- Trimmed away (the stream's cap) while pending: nothing to deliver.
    redis.call('XACK', stream, group, p[1])
  else
    return {p[1], claimed[1][2], p[4] + 1}
  end
end
local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', stream, '>')
if r and r[1] and r[1][2][1] then
  local n = r[1][2][1]
  return {n[1], n[2], 1}
end
return {}
