-- Removes the consumers of a group that hold no message and have been
-- idle long enough (their workers left); checked and removed in one step,
-- so that a consumer cannot take a message in between.
--
-- KEYS[1]: the stream
-- ARGV[1]: the consumer group
-- ARGV[2]: how long a consumer must have been idle (ms)
-- Returns: how many consumers were removed.
local stream = KEYS[1]
local group = ARGV[1]
local idle = ARGV[2]

local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return 0 end
local n = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if tonumber(info['pending']) == 0 and tonumber(info['idle']) >= tonumber(idle) then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, info['name'])
    n = n + 1
  end
end
return n
