-- The process-manager commit: an instance's new state (or its deletion,
-- remembered by tombstones), its correlation entries, its outbox
-- (messages to process managers and endpoints, timeouts), the tallies it
-- opens, and the settling of the messages it handled; all after the
-- checks (version and generation, tallies that exist, tombstones,
-- correlation entries held by another instance).
--
-- KEYS[1]: the instance (a hash: doc, version, gen)
-- KEYS[2]: the partition's set of the process manager's instances
-- KEYS[3]: the queue of the delivery (what the settle touches)
-- KEYS[4]: the partition's schedule
-- KEYS[5]: the dead letters of KEYS[3]
-- then n_add correlation entries to claim, n_rem to release;
-- then n_ep endpoint streams (spread layout: the partition's relay stream
--   for an endpoint in another slot);
-- then the instance's tombstone, and those of the n_add and n_rem entries;
-- then per tally its hash, unchecked and checked sets;
-- then the partition's open tallies;
-- then n_sadd shared correlation entries (sets of instance ids) to join
--   and n_srem to leave;
-- then per value whose held messages the commit releases (the instance's
--   id if it creates it, each entry it claims in its slot): the held ids,
--   their payloads and the schedule they wait in (lib/held.lua);
-- then the partition members (compact layout only; pm_queue.lua).
-- ARGV[1]: '1' if the commit writes an instance
-- ARGV[2]: the version the writer read
-- ARGV[3]: the instance's new state (JSON)
-- ARGV[4]: the instance id
-- ARGV[5]: '1' to delete the instance
-- ARGV[6]: n_add
-- ARGV[7]: n_rem
-- ARGV[8]: n_ep
-- ARGV[9]: n_enq, the messages to enqueue
-- ARGV[10]: n_sch, the timeouts to schedule
-- ARGV[11]: how to settle the delivery: 'none', 'ack', 'dead'
-- ARGV[12]: its entry id
-- ARGV[13]: the consumer group
-- ARGV[14]: the dead letter's payload
-- ARGV[15]: the dead letter's reason
-- ARGV[16]: the payload's size before it was cut ('' = not cut)
-- ARGV[17]: the dead letters' cap (`MAXLEN ~`)
-- ARGV[18]: the endpoint streams' cap
-- ARGV[19]: the id of the message handled ('' = none)
-- ARGV[20]: the tombstones' time to live (ms)
-- ARGV[21]: the JSON array of the message ids a deleted instance handled
-- ARGV[22]: n_tally, the tallies opened
-- ARGV[23]: n_sadd
-- ARGV[24]: n_srem
-- ARGV[25]: the JSON array of the ids of the batched messages (checked
--   against tombstones like the one handled)
-- ARGV[26]: the JSON array of their `[queue, entry id]` to acknowledge
-- ARGV[27]: the instance's generation (a stored one that differs is a
--   conflict, as a version is)
-- ARGV[28]: the JSON array, one per endpoint key, of the endpoint stream
--   a message is relayed to (spread layout: the key given is then the
--   partition's relay stream; `[]` when every endpoint key is the
--   endpoint's own stream)
-- ARGV[29]: n_held, the values whose held messages are released
-- then n_held queues, each the one its value's messages go to;
-- then n_enq (queue, payload) pairs (each queue its partition's);
-- then n_ep endpoint payloads;
-- then n_sch (due ms, payload) pairs;
-- then per tally: its item count n, keep ms, completion, late completion,
--   the queue its completion goes to, the n items, its member of the
--   open tallies.
-- Returns: {new version (0 when no instance is written), then the entry
-- id of each message left for relaying}, or a refusal: {CONFLICT, stored
-- version}, {TAKEN, owner}, {TOMBSTONED} a tombstone remembers a message
-- handled, {TALLY_EXISTS, i} tally i exists already, {ENDPOINT_FULL, i}
-- endpoint key i is full (lib/endpoint_room.lua).
local instance = KEYS[1]
local instances = KEYS[2]
local queue = KEYS[3]
local schedule = KEYS[4]
local dead = KEYS[5]
local has_instance = ARGV[1]
local expected = ARGV[2]
local doc = ARGV[3]
local id = ARGV[4]
local delete = ARGV[5]
local nadd = tonumber(ARGV[6])
local nrem = tonumber(ARGV[7])
local nep = tonumber(ARGV[8])
local nenq = tonumber(ARGV[9])
local nsch = tonumber(ARGV[10])
local settle_kind = ARGV[11]
local entry = ARGV[12]
local group = ARGV[13]
local dead_payload = ARGV[14]
local reason = ARGV[15]
local size = ARGV[16]
local dead_cap = ARGV[17]
local endpoint_cap = ARGV[18]
local handling = ARGV[19]
local tombstone_ttl = ARGV[20]
local deleted_handled = ARGV[21]
local ntally = tonumber(ARGV[22])
local nsadd = tonumber(ARGV[23])
local nsrem = tonumber(ARGV[24])
local batched_ids = ARGV[25]
local batched_acks = ARGV[26]
local generation = ARGV[27]
local relay_targets = ARGV[28]
local nheld = tonumber(ARGV[29])
local PAYLOADS_FROM = 30 + nheld

-- Where the variable runs of KEYS start.
local tomb = 5 + nadd + nrem + nep + 1
local tk = tomb + nadd + nrem
local sh = tk + 3 * ntally + 1

local relays, relayed = cjson.decode(relay_targets), {}
-- First of the checks: an endpoint that cannot take what is sent to it,
-- all of it (a commit may send several messages to one endpoint).
local sending = {}
for i = 1, nep do
  if not relays[i] then
    local s = KEYS[5 + nadd + nrem + i]
    sending[s] = (sending[s] or 0) + 1
  end
end
for i = 1, nep do
  local s = KEYS[5 + nadd + nrem + i]
  if not relays[i] and endpoint_full(s, endpoint_cap, sending[s]) then
    return {ENDPOINT_FULL, i}
  end
end
local now = server_time()
local hk = sh + nsadd + nsrem
local parts = partitioned(KEYS[hk + 3 * nheld + 1], now)
local version = 0
if has_instance == '1' then
  local stored = redis.call('HMGET', instance, 'version', 'gen')
  local v = stored[1] or '0'
  if v ~= expected then return {CONFLICT, v} end
  -- The same version of another generation: deleted and created again
  -- since it was read.
  if stored[2] and generation ~= '' and stored[2] ~= generation then return {CONFLICT, v} end
  for t = 1, ntally do
    if redis.call('EXISTS', KEYS[tk + 3 * t - 2]) == 1 then return {TALLY_EXISTS, t} end
  end
  if delete ~= '1' then
    local handled = cjson.decode(batched_ids)
    if handling ~= '' then table.insert(handled, handling) end
    for _, m in ipairs(handled) do
      for i = 0, nadd do
        if redis.call('SISMEMBER', KEYS[tomb + i], m) == 1 then return {TOMBSTONED} end
      end
    end
  end
  for i = 1, nadd do
    local owner = redis.call('GET', KEYS[5 + i])
    if owner and owner ~= id then return {TAKEN, owner} end
  end
  for i = 1, nrem do
    local k = KEYS[5 + nadd + i]
    if redis.call('GET', k) == id then redis.call('DEL', k) end
  end
  for i = 1, nsadd do redis.call('SADD', KEYS[sh + i], id) end
  for i = 1, nsrem do redis.call('SREM', KEYS[sh + nsadd + i], id) end
  if delete == '1' then
    redis.call('DEL', instance)
    redis.call('SREM', instances, id)
    local handled = cjson.decode(deleted_handled)
    if #handled > 0 then
      local places = {tomb}
      for i = 1, nrem do places[#places + 1] = tomb + nadd + i end
      for _, k in ipairs(places) do
        redis.call('SADD', KEYS[k], unpack(handled))
        redis.call('PEXPIRE', KEYS[k], tombstone_ttl)
      end
    end
  else
    for i = 1, nadd do redis.call('SET', KEYS[5 + i], id) end
    version = tonumber(v) + 1
    redis.call('HSET', instance, 'doc', doc, 'version', version, 'gen', generation)
    redis.call('SADD', instances, id)
    for i = 1, nheld do
      local k = hk + 3 * i - 2
      release_held(KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[29 + i], parts)
    end
  end
end
local a = PAYLOADS_FROM - 1
for i = 1, nenq do
  redis.call('XADD', pm_queue(ARGV[a + 2 * i - 1], parts), '*', 'payload', ARGV[a + 2 * i])
end
a = a + 2 * nenq
for i = 1, nep do
  if relays[i] then
    relayed[#relayed + 1] = redis.call('XADD', KEYS[5 + nadd + nrem + i], '*', 'relay', relays[i], 'envelope', ARGV[a + i])
  else
    endpoint_append(KEYS[5 + nadd + nrem + i], endpoint_cap, ARGV[a + i])
  end
end
a = a + nep
for i = 1, nsch do redis.call('ZADD', schedule, ARGV[a + 2 * i - 1], ARGV[a + 2 * i]) end
a = a + 2 * nsch
for t = 1, ntally do
  local h, pend, checked = KEYS[tk + 3 * t - 2], KEYS[tk + 3 * t - 1], KEYS[tk + 3 * t]
  local n, keep, first = tonumber(ARGV[a + 1]), ARGV[a + 2], a + 6
  redis.call('DEL', pend, checked)
  redis.call('SADD', checked, '')
  redis.call('PEXPIRE', checked, keep)
  for i = first, first + n - 1, 500 do
    redis.call('SADD', pend, unpack(ARGV, i, math.min(i + 499, first + n - 1)))
  end
  local total = redis.call('SCARD', pend)
  redis.call('HSET', h, 'total', total, 'done', total == 0 and 1 or 0, 'completion', ARGV[a + 3], 'completion_late', ARGV[a + 4])
  redis.call('PEXPIRE', h, keep)
  if total == 0 then
    redis.call('XADD', pm_queue(ARGV[a + 5], parts), '*', 'payload', ARGV[a + 3])
  else
    redis.call('PEXPIRE', pend, keep)
    redis.call('ZADD', KEYS[sh], now + tonumber(keep), ARGV[first + n])
  end
  a = first + n
end
if settle_kind == 'dead' then
  local fields = {'payload', dead_payload, 'reason', reason, 'task', '', 'at', now}
  if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
  redis.call('XADD', dead, 'MAXLEN', '~', dead_cap, '*', unpack(fields))
end
if settle_kind == 'ack' or settle_kind == 'dead' then settle(queue, group, entry) end
for _, b in ipairs(cjson.decode(batched_acks)) do settle(b[1], group, b[2]) end
local out = {version}
for _, id_ in ipairs(relayed) do out[#out + 1] = id_ end
return out
