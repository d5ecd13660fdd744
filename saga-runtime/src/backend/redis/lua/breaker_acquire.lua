-- A shared circuit breaker's decision before a call: closed, open, or
-- half-open with one probe let through (under the caller's token).
--
-- KEYS[1]: the breaker (a hash: open_until, failures, probe_until, probe)
-- ARGV[1]: how long the probe's slot is held (ms)
-- ARGV[2]: the caller's token
-- Returns: {1, 0, counting} call (counting: 1 while failures are being
-- counted), {1, 1, 0} call as the probe, {0, ms} open for ms more.
local breaker = KEYS[1]
local probe_ttl = ARGV[1]
local token = ARGV[2]

local now = server_time()
local open_until = tonumber(redis.call('HGET', breaker, 'open_until') or '0')
if open_until == 0 then
  local failures = tonumber(redis.call('HGET', breaker, 'failures') or '0')
  return {1, 0, failures > 0 and 1 or 0}
end
if now < open_until then return {0, open_until - now} end
local probe_until = tonumber(redis.call('HGET', breaker, 'probe_until') or '0')
if now < probe_until then return {0, probe_until - now} end
redis.call('HSET', breaker, 'probe_until', now + tonumber(probe_ttl), 'probe', token)
return {1, 1, 0}
