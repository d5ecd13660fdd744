-- Checks a task write before it writes anything (needs refusals.lua): the
-- fence it carries must be the task's latest (else its lease was lost),
-- and the version it read must be the stored one. Returns the refusal to
-- answer ({LOCK_LOST, stored fence}, {MISSING, nil}, {CONFLICT, stored
-- version}), or nil and the version the write stores.
local function check_write(fence_key, fence, task_key, version)
  local f = redis.call('GET', fence_key)
  if f ~= fence then return {LOCK_LOST, f} end
  local v = redis.call('HGET', task_key, 'version')
  if not v then return {MISSING, false} end
  if v ~= version then return {CONFLICT, v} end
  return nil, tonumber(v) + 1
end
