-- Effect `retain` of a task write (apply.lua): every key of the task
-- expires this long after the write (and the task joins the partition's
-- expiring tasks), or, with '' as the time, the task is kept and an
-- earlier expiry undone (a requeued task).
--
-- Keys: the partition's expiring tasks, the task's claims, its audit
-- log. Arguments: the time (ms, or ''), the task's member of the expiring
-- tasks under its stored status ('' = none: not terminal), its member
-- under the new status. Parsed (and the time checked, before anything is
-- written) at key `k` and argument `a`; returns what runs it and the next
-- key and argument, or an error reply for a time out of range.
local function effect_retain(keys, k, argv, a)
  local expiring, claims_key, audit_key = keys[k], keys[k + 1], keys[k + 2]
  local after, stored_member, new_member = argv[a], argv[a + 1], argv[a + 2]
  local expire = tonumber(after)
  if after ~= '' and (not expire or expire < 1 or expire > 1e13) then
    return redis.error_reply('expire-after out of range: ' .. after)
  end
  local run = function(w)
    if stored_member ~= '' then redis.call('ZREM', expiring, stored_member) end
    local task_keys = {w.task_key, w.fence_key, w.cancel_key, claims_key, audit_key}
    if w.apart then task_keys = {w.task_key, audit_key} end
    if after ~= '' then
      for _, key in ipairs(task_keys) do redis.call('PEXPIRE', key, expire) end
      redis.call('ZADD', expiring, w.now() + expire, new_member)
    elseif stored_member ~= '' then
      for _, key in ipairs(task_keys) do redis.call('PERSIST', key) end
    end
  end
  return run, k + 3, a + 3
end
