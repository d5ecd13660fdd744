-- The server's time in milliseconds (`TIME`): delays and expiries do not
-- depend on the clocks of the machines the workers run on.
local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
