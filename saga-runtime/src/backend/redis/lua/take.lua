-- Reads up to a number of messages for a consumer without blocking: from
-- the first stream, in turn from the given one, that has any. The caller
-- starts on every message it takes at once: a message read but not
-- started is kept alive by nobody, and if it waited behind a long step it
-- would be taken over and counted as a delivery that was never answered.
-- (So a read takes what the worker will work on now, not one per stream
-- as a plain `XREADGROUP` over several streams would.)
--
-- With `0` it reads what this consumer was given but may never have
-- received: a read whose reply was lost with its connection. Entries
-- deleted meanwhile are dropped from the pending list.
--
-- For a saga message whose task exists in the stream's partition, it also
-- takes the task's lease as lock.lua does, in the same round trip: the
-- worker then starts on the task at once. The task's keys are built from
-- the partition's prefix and the id in the payload; they share the
-- stream's hash tag (one slot). Anything else (a process-manager message,
-- an entry that does not decode, a task not found there) is returned
-- without a lease, for the worker to deal with as before. Two messages of
-- one task in one read: the second finds the lease taken.
--
-- For a process-manager envelope that names its instance (a timeout) or
-- carries its routing key (`key`, `key_field`), it loads the instance the
-- handler will need, as `process_load` / `process_find` would.
--
-- KEYS[1..n]: the work streams
-- ARGV[1]: the consumer group
-- ARGV[2]: the consumer
-- ARGV[3]: the first stream to look at (0-based)
-- ARGV[4]: `>` (new messages) or `0` (this consumer's own pending ones)
-- ARGV[5]: the lease token
-- ARGV[6]: the lease's time to live (ms)
-- ARGV[7]: at most this many messages
-- ARGV[8..7 + n]: per stream, the key prefix of its partition's tasks, or
--   for a process-manager stream `pm|` and the prefix of its keys
--   (`pm|<prefix>|<partition>|<partitions>` in the spread layout)
-- Returns: a list of {stream index, entry id, fields, delivery count,
-- loaded}; the fields raw, for the caller to decode. `loaded` is nil
-- (nothing), {0, id} (the task's lease is held by another worker),
-- {fence, id, record, version, cancellation flag, apart} (the task's
-- lease, taken; the record whole and whether it is kept apart, as
-- read_record reads them), or {'pm', key, key field, record, version}
-- (an instance, or none: no record).
local group = ARGV[1]
local consumer = ARGV[2]
local first = tonumber(ARGV[3])
local start = ARGV[4]
local token = ARGV[5]
local ttl = ARGV[6]
local max = tonumber(ARGV[7])
local PREFIXES_FROM = 8

local function decoded(fields)
  local payload
  for i = 1, #fields, 2 do
    if fields[i] == 'payload' then payload = fields[i + 1] end
  end
  if not payload or string.byte(payload, 1) ~= 123 then return nil end
  local ok, m = pcall(cjson.decode, payload)
  if not ok or type(m) ~= 'table' then return nil end
  return m
end
-- Whether the keys of `target` (an instance id or a correlation value) are
-- in this partition: always in the compact layout (`k` nil), where all
-- process-manager keys share a slot; in the spread layout, only where
-- the target hashes to it (a message read elsewhere is forwarded first).
local function here(process, target, k, n)
  if k == nil then return true end
  return route_hash(process .. ':' .. target) % n == k
end
local function instance(spec, m)
  if type(m.process) ~= 'string' then return false end
  local sep = string.find(spec, '|', 1, true)
  local tag, k, n = spec, nil, nil
  if sep then
    tag = string.sub(spec, 1, sep - 1)
    local rest = string.sub(spec, sep + 1)
    local sep2 = string.find(rest, '|', 1, true)
    k, n = tonumber(string.sub(rest, 1, sep2 - 1)), tonumber(string.sub(rest, sep2 + 1))
  end
  local key, field, id = m.instance_id, '', nil
  if type(key) == 'string' then
    id = key
  else
    key = m.key
    if type(key) ~= 'string' then return false end
    if type(m.key_field) == 'string' then
      field = m.key_field
      if not here(m.process, key, k, n) then return false end
      id = redis.call('GET', tag .. ':idx:' .. m.process .. ':' .. field .. ':' .. key)
      if not id then return {'pm', key, field} end
    else
      id = key
    end
  end
  if not here(m.process, id, k, n) then return false end
  local rec = redis.call('HMGET', tag .. ':inst:' .. m.process .. ':' .. id, 'doc', 'version')
  return {'pm', key, field, rec[1], rec[2]}
end
-- The task id of a saga message exactly as the engine writes it
-- (`{"task_id":..,"saga":..,"seq":..}` and nothing else), read without
-- decoding it; nil for anything else.
local function saga_task(fields)
  if fields[1] ~= 'payload' or #fields ~= 2 then return nil end
  return string.match(fields[2], '^{"task_id":"([0-9a-f%-]+)","saga":"[^"\\]*","seq":%d+}$')
end
local function lease(prefix, fields)
  if prefix == '' then return false end
  local id
  if string.sub(prefix, 1, 3) ~= 'pm|' then id = saga_task(fields) end
  if not id then
    local m = decoded(fields)
    if not m then return false end
    if string.sub(prefix, 1, 3) == 'pm|' then return instance(string.sub(prefix, 4), m) end
    if type(m.task_id) ~= 'string' then return false end
    id = m.task_id
    if m.process ~= nil or not string.match(id, '^[0-9a-f%-]+$') then return false end
  end
  -- The record first (the script is atomic): no lease for a task that
  -- does not exist here.
  local task_key = prefix .. ':task:' .. id
  local doc, version, apart, cancel = read_record(task_key)
  if not doc then return false end
  if not redis.call('SET', prefix .. ':lock:' .. id, token, 'NX', 'PX', ttl) then
    return {0, id}
  end
  local fence = next_fence(task_key, prefix .. ':fence:' .. id, apart)
  if not apart then cancel = redis.call('GET', prefix .. ':cancel:' .. id) end
  return {fence, id, doc, version, cancel, apart}
end

local n = #KEYS
local out = {}
for i = 0, n - 1 do
  local s = (first + i) % n
  local q = KEYS[s + 1]
  for _ = 1, 64 do
    local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max - #out, 'STREAMS', q, start)
    local entries = r and r[1][2]
    if not entries or #entries == 0 then break end
    local live = 0
    for _, e in ipairs(entries) do
      if e[2] then
        local count = 1
        if start ~= '>' then
          local p = redis.call('XPENDING', q, group, e[1], e[1], 1)
          if p[1] then count = p[1][4] end
        end
        out[#out + 1] = {s, e[1], e[2], count, lease(ARGV[PREFIXES_FROM + s], e[2])}
        live = live + 1
      else
        redis.call('XACK', q, group, e[1])
      end
    end
    -- Reading own pending entries again would return the same ones.
    if #out >= max or (start ~= '>' and live > 0) then break end
  end
  if #out >= max then break end
end
return out
