-- Removes a consumer from its group if it holds no message.
--
-- KEYS[1]: the stream
-- ARGV[1]: the consumer group
-- ARGV[2]: the consumer
-- Returns: 1 if removed, else 0.
local stream = KEYS[1]
local group = ARGV[1]
local consumer = ARGV[2]

local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return 0 end
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] == consumer and tonumber(info['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer)
    return 1
  end
end
return 0
