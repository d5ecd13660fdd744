-- Records a call's outcome on a shared circuit breaker (see
-- `Breakers::breaker_report`); a probe whose slot has since gone to
-- another is ignored; the state expires after `keep` without calls, so
-- idle breakers go.
--
-- KEYS[1]: the breaker
-- ARGV[1]: the probe's token ('' = not a probe)
-- ARGV[2]: '1' failed, '0' succeeded, '-' the call did not happen
-- ARGV[3]: the failures that open the breaker
-- ARGV[4]: how long it stays open (ms)
-- ARGV[5]: how long the state is kept without calls (ms)
-- Returns: 1 if this report opened the breaker, 2 if it closed it, else 0.
local breaker = KEYS[1]
local probe_token = ARGV[1]
local outcome = ARGV[2]
local threshold = ARGV[3]
local open_ms = ARGV[4]
local keep = ARGV[5]

local now = server_time()
local probe, failed = probe_token ~= '', outcome == '1'
if probe then
  local out = tonumber(redis.call('HGET', breaker, 'probe_until') or '0')
  if out == 0 or redis.call('HGET', breaker, 'probe') ~= probe_token then return 0 end
end
if outcome == '-' then
  if probe and redis.call('EXISTS', breaker) == 1 then redis.call('HSET', breaker, 'probe_until', 0) end
  return 0
end
local open_until = tonumber(redis.call('HGET', breaker, 'open_until') or '0')
local changed = 0
if not failed then
  if probe then redis.call('DEL', breaker) return 2 end
  if open_until == 0 and redis.call('HEXISTS', breaker, 'failures') == 1 then
    redis.call('HSET', breaker, 'failures', 0)
  end
elseif probe then
  redis.call('HSET', breaker, 'open_until', now + tonumber(open_ms), 'probe_until', 0, 'failures', 0)
  changed = 1
elseif open_until == 0 then
  local f = redis.call('HINCRBY', breaker, 'failures', 1)
  if f >= tonumber(threshold) then
    redis.call('HSET', breaker, 'open_until', now + tonumber(open_ms), 'failures', 0)
    changed = 1
  end
end
if redis.call('EXISTS', breaker) == 1 then redis.call('PEXPIRE', breaker, keep) end
return changed
