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
-- The same for a record that keeps its control state in its hash (record
-- layout 2, see record.lua): one HMGET reads the fence, the version, the
-- cancellation flag and whether `claim` was claimed. Returns the refusal,
-- or nil, the version the write stores, the flag (false: none) and
-- whether the claim was there.
local function check_write_apart(task_key, fence, version, claim)
  local r = redis.call('HMGET', task_key, 'fence', 'version', 'cancel', 'c:' .. claim)
  if r[1] ~= fence then return {LOCK_LOST, r[1]} end
  if not r[2] then return {MISSING, false} end
  if r[2] ~= version then return {CONFLICT, r[2]} end
  return nil, tonumber(r[2]) + 1, r[3], r[4] ~= false
end
-- Checks a write in either record layout (`apart`: layout 2). Returns the
-- refusal, or nil and: the version the write stores; the cancellation
-- flag (false: none; in layout 1 read from `cancel_key`, only when one
-- is given); and whether `claim` was claimed already (layout 2 only: in
-- layout 1 `claim_attempt` takes the claim).
local function check_record(apart, fence_key, task_key, cancel_key, fence, version, claim)
  if apart then return check_write_apart(task_key, fence, version, claim) end
  local refused, nv = check_write(fence_key, fence, task_key, version)
  if refused then return refused end
  local flag = false
  if cancel_key then flag = redis.call('GET', cancel_key) end
  return nil, nv, flag, nil
end
-- The fields that take `claim` with the record's write in layout 2 (nil:
-- nothing to add).
local function claim_fields(apart, claim, claimed)
  if apart and not claimed then return {'c:' .. claim, 1} end
  return nil
end
-- 1 if `claim` is new: in layout 2 as the check found it (its field went
-- with the record), in layout 1 by taking it in `claims_key` now.
local function claim_attempt(apart, claims_key, claim, claimed)
  if apart then return claimed and 0 or 1 end
  return redis.call('HSETNX', claims_key, claim, 1)
end
