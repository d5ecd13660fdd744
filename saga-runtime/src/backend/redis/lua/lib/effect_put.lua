-- Effect `put` of a task write (apply.lua): the record stored under the
-- next version, its new audit entries appended, its status moved between
-- the saga's indexes.
--
-- Keys: the saga's index of the stored status, of the new status, the
-- task's audit log. Arguments: the record (JSON, or its head: record.lua),
-- the new status, when the task was created (ms), how many audit entries
-- the log keeps, a count of field-value pairs and the pairs, a count of
-- audit entries and the entries.
--
-- Parses the effect at key `k` and argument `a`; returns what runs it
-- (given the write's context) and the next key and argument.
local function effect_put(keys, k, argv, a)
  local index_from, index_to, audit_key = keys[k], keys[k + 1], keys[k + 2]
  local doc, status, created, audit_cap = argv[a], argv[a + 1], argv[a + 2], argv[a + 3]
  local record_from = a + 4
  local audit_from = after_record(argv, record_from) + 1
  local audit_to = audit_from + tonumber(argv[audit_from - 1]) - 1
  local run = function(w)
    w.put = true
    audit(audit_key, audit_cap, argv, audit_from, audit_to)
    local extra = nil
    if w.claim then extra = claim_fields(w.apart, w.claim, w.claimed) end
    write_record(w.task_key, doc, w.version, status, argv, record_from, extra)
    if index_from ~= index_to then
      redis.call('ZREM', index_from, w.id)
      redis.call('ZADD', index_to, created, w.id)
    end
  end
  return run, k + 3, audit_to + 1
end
