-- A task's record in its hash (see record.rs). Layout 1: `doc` holds the
-- whole record. Layout 2: `h` holds what is fixed when the task is
-- created, `doc` what changes (neither has `steps`), `n` the number of
-- steps and `s:<i>` step `i`.
--
-- Reads record `key` as one JSON object, the whole record in either
-- layout (nil: no task), with its version, whether it is kept apart
-- (layout 2: 1, else false) and, in layout 2, its cancellation flag
-- (layout 1 keeps the flag in a key of its own).
local function read_record(key)
  -- One HMGET reads the record and, for a task of up to 8 steps, every
  -- step; a longer task reads the rest with a second.
  local rec = redis.call('HMGET', key, 'doc', 'version', 'n', 'h', 'cancel',
    's:0', 's:1', 's:2', 's:3', 's:4', 's:5', 's:6', 's:7')
  if not rec[1] then return nil, nil, false, false end
  local n = tonumber(rec[3])
  if not n then return rec[1], rec[2], false, false end
  -- A step count that is no count, or beyond the hash's fields, is a
  -- damaged record: answered as one that does not parse (unreadable), not
  -- read step by step for as long as the number says.
  if n < 0 or n % 1 ~= 0 or (n > 8 and n > redis.call('HLEN', key)) then
    return '{"unreadable":"step count ' .. rec[3] .. '"}', rec[2], 1, rec[5]
  end
  local steps = {}
  for i = 1, math.min(n, 8) do steps[i] = rec[5 + i] end
  if n > 8 then
    local names = {}
    for i = 8, n - 1 do names[#names + 1] = 's:' .. i end
    local more = redis.call('HMGET', key, unpack(names))
    for i = 1, #names do steps[8 + i] = more[i] end
  end
  -- A missing step leaves the list short: unreadable, not a task with a
  -- step less.
  for i = 1, n do
    if not steps[i] then steps[i] = 'null' end
  end
  local head = rec[4] or '{}'
  local whole = '{' .. string.sub(head, 2, -2) .. ',' .. string.sub(rec[1], 2, -2)
    .. ',"steps":[' .. table.concat(steps, ',') .. ']}'
  return whole, rec[2], 1, rec[5]
end
-- Takes the next fence of a task whose record was just read: a field of
-- its hash in layout 2, a key of its own in layout 1.
local function next_fence(task_key, fence_key, apart)
  if apart then return redis.call('HINCRBY', task_key, 'fence', 1) end
  return redis.call('INCR', fence_key)
end
-- Writes record `key`: `doc`, the version and the status, the `argv[from]`
-- pairs of field and value after it (in layout 2: `n`, the steps that
-- changed, and `h` when the task is created; none in layout 1), and the
-- pairs in `extra` (a claim, in layout 2). Returns the index of the
-- argument after them.
local function write_record(key, doc, version, status, argv, from, extra)
  local last = from + 2 * tonumber(argv[from])
  local fields = {'doc', doc, 'version', version, 'status', status}
  for _, v in ipairs(extra or {}) do fields[#fields + 1] = v end
  for i = from + 1, last do
    fields[#fields + 1] = argv[i]
    -- Lua unpacks at most a few thousand values at once.
    if #fields >= 1000 then
      redis.call('HSET', key, unpack(fields))
      fields = {}
    end
  end
  if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  return last + 1
end
-- The index of the argument after the pairs counted at `argv[from]`.
local function after_record(argv, from)
  return from + 1 + 2 * tonumber(argv[from])
end
