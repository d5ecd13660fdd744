-- One task write (backend/write.rs): the guards checked, every one before
-- any effect, then the effects applied in order. The write was decided
-- by the engine; this script checks and applies, and each effect is a
-- library of its own (lib/effect_*.lua), the guards lib/guard_task.lua.
-- Every effect is parsed before the guards are checked (the delays and
-- retention times range-checked), so a bad argument writes nothing
-- either.
--
-- KEYS[1]: the task's fence counter
-- KEYS[2]: the task's record
-- KEYS[3]: the task's cancellation flag
-- KEYS[4..]: the effects' keys, each effect's in turn (see its library)
-- ARGV[1]: the fence of the writer's lease
-- ARGV[2]: the version the writer read
-- ARGV[3]: the task id
-- ARGV[4]: '1' when the record is in layout 2 (record.lua: its fence,
--   claims and cancellation flag are fields of KEYS[2])
-- ARGV[5]: the guards, a letter each: 'F' the fence, 'V' the version
--   (both required: a task write is fenced and versioned), 'C' no
--   cancellation requested; checked in that order
-- ARGV[6..]: the effects, each its name ('put', 'claim', 'renew',
--   'enqueue', 'ack', 'dead', 'resolve', 'retain', 'unlock', 'announce')
--   followed by its arguments
-- Returns: {the version stored after the write (the same when it puts no
-- record), 1 if a claim is new else 0}, or a refusal:
-- {LOCK_LOST, fence}, {MISSING}, {CONFLICT, stored version},
-- {CANCEL_REQUESTED, flag}; an error for an unknown effect, a guard set
-- that is not fenced and versioned, or a number out of range.
local EFFECTS = {
  put = effect_put, claim = effect_claim, renew = effect_renew,
  enqueue = effect_enqueue, ack = effect_ack, dead = effect_dead,
  resolve = effect_resolve, retain = effect_retain, unlock = effect_unlock,
  announce = effect_announce,
}
local fence_key = KEYS[1]
local task_key = KEYS[2]
local cancel_key = KEYS[3]
local fence = ARGV[1]
local version = ARGV[2]
local id = ARGV[3]
local apart = ARGV[4] == '1'
local guards = ARGV[5]
local EFFECTS_FROM = 6
-- What the effects are given when they run.
local w = {
  fence_key = fence_key, task_key = task_key, cancel_key = cancel_key,
  id = id, apart = apart,
}
local t = nil
w.now = function()
  if not t then t = server_time() end
  return t
end

local runs = {}
local k, a = 4, EFFECTS_FROM
while a <= #ARGV do
  local parse = EFFECTS[ARGV[a]]
  if not parse then return redis.error_reply('unknown effect: ' .. ARGV[a]) end
  local run, nk, na, claim = parse(KEYS, k, ARGV, a + 1)
  if type(run) ~= 'function' then return run end
  runs[#runs + 1] = run
  if claim then w.claim = claim end
  k, a = nk, na
end

if not (string.find(guards, 'F', 1, true) and string.find(guards, 'V', 1, true)) then
  return redis.error_reply('a task write is fenced and versioned, not: ' .. guards)
end
local unless_cancelled = string.find(guards, 'C', 1, true) ~= nil
-- The flag is read only for a write that asks to be refused by it.
local flag_key = nil
if unless_cancelled then flag_key = cancel_key end
local refused, nv, flag, claimed =
  check_record(apart, fence_key, task_key, flag_key, fence, version, w.claim or '')
if refused then return refused end
if unless_cancelled and flag then return {CANCEL_REQUESTED, flag} end
w.version, w.claimed = nv, claimed
for _, run in ipairs(runs) do run(w) end
-- A write that puts no record leaves its version as it was.
if not w.put then nv = nv - 1 end
return {nv, w.claimed_now or 0}
