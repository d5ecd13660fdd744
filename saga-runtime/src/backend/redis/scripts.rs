//! The Lua scripts. Each one is a single atomic step of the protocol; each
//! touches only the keys it is given, all of one partition (see `keys.rs`).
//!
//! Two rules every script follows:
//!
//! - **Refuse before writing.** A script that fails half-way keeps the
//!   writes it made (Redis has no rollback), so every check (fence, version,
//!   cancellation) comes before the first write.
//! - **Settle with `pcall`.** Acknowledging a message whose consumer group
//!   is gone (Redis restarted empty, failed over) must not fail the write it
//!   settles: with no group there is nothing pending to acknowledge.
//!
//! Time is the server's (`TIME`): delays and expiries do not depend on the
//! clocks of the machines the workers run on.
//!
//! Error protocol of task writes: a positive integer is the new version;
//! `-1` means the fencing token is stale (lock lost), `-2` a version
//! conflict, `-3` a missing task, `-5` a recorded cancellation. The second
//! element carries the stored value.

use std::sync::LazyLock;

use redis::Script;

use super::keys::ROUTE_HASH_LUA;

/// Server time in milliseconds, as `now`.
const NOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
";

/// Process-manager partitions are written only while an engine reads
/// them (`members` has a live entry): until then, during a rolling deploy
/// from a version without partitions, messages go to the shared stream
/// that every version reads. `pm_queue` maps a partition's queue key to
/// the one to write. The spread layout (a cluster) has no such past, and
/// its members live in another slot: its scripts are given no `members`
/// key, and always write the partitions. Needs `NOW`.
const PM_QUEUE_FN: &str = r"
local function partitioned(members)
  if members == nil then return true end
  return redis.call('ZCOUNT', members, now, '+inf') > 0
end
local function pm_queue(q, yes)
  if yes then return q end
  return (string.gsub(q, ':%d+$', ''))
end
";

/// Moves the due entries of delayed set `d` (`<unanswered>:<payload>`)
/// onto stream `q`, at most `limit`; returns how many. Needs `NOW`.
const MOVE_DUE_FN: &str = r"
local function move_due(d, q, limit)
  local due = redis.call('ZRANGEBYSCORE', d, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    redis.call('ZREM', d, m)
    local sep = string.find(m, ':', 1, true)
    local n = tonumber(string.sub(m, 1, sep - 1)) or 0
    local payload = string.sub(m, sep + 1)
    if n > 0 then
      redis.call('XADD', q, '*', 'payload', payload, 'unanswered', n)
    else
      redis.call('XADD', q, '*', 'payload', payload)
    end
  end
  return #due
end
";

/// Acknowledges and deletes entry `e` of stream `q` for group `g`; returns
/// 1 if it was pending.
const SETTLE_FN: &str = r"
local function settle(q, g, e)
  local ok, n = pcall(redis.call, 'XACK', q, g, e)
  redis.call('XDEL', q, e)
  if ok then return n end
  return 0
end
";

/// Appends the audit entries `ARGV[first..]` to list `key`, keeping the
/// last `cap`: in chunks, since Lua cannot unpack many thousands of values
/// at once (a record written before the log had its own list may carry
/// that many). Scripts call it right after their checks, before their
/// other writes: a refusal then leaves nothing half-written.
const AUDIT_FN: &str = r"
local function audit(key, cap, first)
  local len = 0
  for i = first, #ARGV, 500 do
    len = redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 499, #ARGV)))
  end
  if len > tonumber(cap) then redis.call('LTRIM', key, -tonumber(cap), -1) end
end
";

/// KEYS: task, index (all), index (Pending), queue, audit.
/// ARGV: doc, id, payload, created ms, audit cap, then audit entries.
/// Returns the existing doc when the task exists (nothing written), else nil.
pub static CREATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{AUDIT_FN}
local existing = redis.call('HGET', KEYS[1], 'doc')
if existing then return existing end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', 1, 'status', 'Pending')
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('XADD', KEYS[4], '*', 'payload', ARGV[3])
audit(KEYS[5], ARGV[5], 6)
return false"
    ))
});

/// KEYS: lock, fence, task, cancel. ARGV: token, ttl ms.
/// Returns false when locked, {0} when the task does not exist (nothing
/// written: a stray message must not leave a fence behind), else
/// {fence, doc, version, cancel}.
pub static LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[3]) == 0 then return {0} end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local fence = redis.call('INCR', KEYS[2])
local rec = redis.call('HMGET', KEYS[3], 'doc', 'version')
return {fence, rec[1], rec[2], redis.call('GET', KEYS[4])}",
    )
});

/// Checks KEYS[1] (fence) against ARGV[1] and KEYS[2] (task) version
/// against ARGV[2]; leaves the stored version in `v`.
const CHECK: &str = r"
local f = redis.call('GET', KEYS[1])
if f ~= ARGV[1] then return {-1, f} end
local v = redis.call('HGET', KEYS[2], 'version')
if not v then return {-3, false} end
if v ~= ARGV[2] then return {-2, v} end
local nv = tonumber(v) + 1
";

/// KEYS: fence, task, claims, index (stored status), index (new status),
/// audit.
/// ARGV: fence, version, doc, claim, new status, id, created ms, audit cap,
/// then the audit entries to append.
/// Returns {new version, claimed 0/1}.
pub static RECORD_ATTEMPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{AUDIT_FN}{CHECK}
audit(KEYS[6], ARGV[8], 9)
redis.call('HSET', KEYS[2], 'doc', ARGV[3], 'version', nv, 'status', ARGV[5])
if KEYS[4] ~= KEYS[5] then
  redis.call('ZREM', KEYS[4], ARGV[6])
  redis.call('ZADD', KEYS[5], ARGV[7], ARGV[6])
end
return {{nv, redis.call('HSETNX', KEYS[3], ARGV[4], 1)}}"
    ))
});

/// KEYS: fence, task, claims, index (stored status), index (new status),
/// lock, queue, cancel, audit.
/// ARGV: 1 fence, 2 version, 3 doc, 4 claim, 5 new status, 6 id, 7 created
/// ms, 8 lease token, 9 ttl ms ('' = no renewal), 10 group, 11 consumer, 12
/// entry id, 13 unless cancelled ('1'), 14 audit cap, then the audit
/// entries to append.
///
/// `RECORD_ATTEMPT` for a worker that goes on with the task it holds: the
/// last attempt's outcome and the next attempt, under the same lease
/// (renewed if asked; set again if it just expired, which the fence check
/// proves nobody else noticed) and the same message (kept alive if asked). Refused with
/// {-5, cancel} when asked to and cancellation was requested.
/// Returns {new version, claimed 0/1}.
pub static RECORD_NEXT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{AUDIT_FN}{CHECK}
if ARGV[13] == '1' then
  local c = redis.call('GET', KEYS[8])
  if c then return {{-5, c}} end
end
audit(KEYS[9], ARGV[14], 15)
redis.call('HSET', KEYS[2], 'doc', ARGV[3], 'version', nv, 'status', ARGV[5])
if KEYS[4] ~= KEYS[5] then
  redis.call('ZREM', KEYS[4], ARGV[6])
  redis.call('ZADD', KEYS[5], ARGV[7], ARGV[6])
end
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[6], ARGV[8], 'PX', ARGV[9])
  pcall(redis.call, 'XCLAIM', KEYS[7], ARGV[10], ARGV[11], 0, ARGV[12], 'JUSTID')
end
return {{nv, redis.call('HSETNX', KEYS[3], ARGV[4], 1)}}"
    ))
});

/// KEYS: fence, task, lock, queue, dead, cancel, delayed, index (stored
/// status), index (new status), expiring, claims, audit.
/// ARGV: 1 fence, 2 version, 3 doc, 4 token, 5 next payload ('' = none),
/// 6 next delay ms, 7 settle ('none'|'ack'|'dead'|'resolve'), 8 entry id,
/// 9 group, 10 dead-letter payload, 11 reason, 12 task id, 13 unless
/// cancelled ('1'), 14 new status, 15 expire after ms ('' = keep), 16
/// created ms, 17 expiring member of the stored status ('' = none), 18
/// expiring member of the new status, 19 payload size ('' = not cut), 20
/// dead-letter cap, 21 channel to publish the task id on ('' = none: set
/// when the task ends, for waiters), 22 audit cap, then the audit entries
/// to append.
/// A next message due later is enqueued at once instead when the task's
/// cancellation was requested: the cancellation must not wait out a
/// backoff (its own wake-up message may be stale by now).
/// Returns {new version} or {-5, cancel} when refused for a cancellation.
pub static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{SETTLE_FN}{AUDIT_FN}{CHECK}
local cancelled = redis.call('EXISTS', KEYS[6]) == 1
if ARGV[13] == '1' and cancelled then return {{-5, redis.call('GET', KEYS[6])}} end
local expire = tonumber(ARGV[15])
if ARGV[15] ~= '' and (not expire or expire < 1 or expire > 1e13) then
  return redis.error_reply('expire-after out of range: ' .. ARGV[15])
end
local delay = tonumber(ARGV[6])
if not delay or delay < 0 or delay > 1e13 then
  return redis.error_reply('delay out of range: ' .. ARGV[6])
end
if cancelled then delay = 0 end
audit(KEYS[12], ARGV[22], 23)
redis.call('HSET', KEYS[2], 'doc', ARGV[3], 'version', nv, 'status', ARGV[14])
if KEYS[8] ~= KEYS[9] then
  redis.call('ZREM', KEYS[8], ARGV[12])
  redis.call('ZADD', KEYS[9], ARGV[16], ARGV[12])
end
if ARGV[17] ~= '' then redis.call('ZREM', KEYS[10], ARGV[17]) end
local task_keys = {{KEYS[2], KEYS[1], KEYS[6], KEYS[11], KEYS[12]}}
if ARGV[15] ~= '' then
  for _, k in ipairs(task_keys) do redis.call('PEXPIRE', k, expire) end
  redis.call('ZADD', KEYS[10], now + expire, ARGV[18])
elseif ARGV[17] ~= '' then
  for _, k in ipairs(task_keys) do redis.call('PERSIST', k) end
end
if ARGV[5] ~= '' then
  if delay == 0 then
    redis.call('XADD', KEYS[4], '*', 'payload', ARGV[5])
  else
    redis.call('ZADD', KEYS[7], now + delay, '0:' .. ARGV[5])
  end
end
if ARGV[7] == 'dead' then
  local fields = {{'payload', ARGV[10], 'reason', ARGV[11], 'task', ARGV[12], 'at', now}}
  if ARGV[19] ~= '' then table.insert(fields, 'size') table.insert(fields, ARGV[19]) end
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[20], '*', unpack(fields))
end
if ARGV[7] == 'ack' or ARGV[7] == 'dead' then settle(KEYS[4], ARGV[9], ARGV[8]) end
if ARGV[7] == 'resolve' then redis.call('XDEL', KEYS[5], ARGV[8]) end
if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
if ARGV[21] ~= '' then redis.call('PUBLISH', ARGV[21], ARGV[12]) end
return {{nv}}"
    ))
});

/// KEYS: lock, queue, cancel. ARGV: token, ttl ms, group, consumer, entry id.
/// Extends the lock and resets the message's idle time (while the lock is
/// held), reads the cancel flag.
/// Returns {held 0/1, cancel}.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local held = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- Keep the message only while the lease is ours: a worker that lost
  -- its lease must not take the message back from the one that took over.
  pcall(redis.call, 'XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, ARGV[5], 'JUSTID')
  held = 1
end
return {held, redis.call('GET', KEYS[3])}",
    )
});

/// KEYS: lock. ARGV: token. Compare-and-delete; returns 1 if released.
pub static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0",
    )
});

/// KEYS: queue. ARGV: group, entry id. Acknowledge and delete.
pub static ACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{SETTLE_FN}
return settle(KEYS[1], ARGV[1], ARGV[2])"
    ))
});

/// KEYS: queue, delayed. ARGV: group, consumer, entry id, delay ms,
/// answered ('1': this delivery counts as answered).
///
/// Hands a message back: if it is still pending for this consumer, it is
/// acknowledged and a copy of its payload is enqueued now (or put on the
/// delayed set), carrying its count of unanswered deliveries. Returns 1 if handed back, 0 if it was no longer ours (settled
/// meanwhile, or taken over by another consumer).
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
local ok, p = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not ok or #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
local e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
if #e == 0 then return 0 end
local payload, carried = nil, 0
local f = e[1][2]
for i = 1, #f, 2 do
  if f[i] == 'payload' then payload = f[i + 1] end
  if f[i] == 'unanswered' then carried = tonumber(f[i + 1]) or 0 end
end
if not payload then return 0 end
local unanswered = carried + tonumber(p[1][4])
if ARGV[5] == '1' then unanswered = unanswered - 1 end
if ARGV[4] == '0' then
  redis.call('XADD', KEYS[1], '*', 'payload', payload, 'unanswered', unanswered)
else
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), unanswered .. ':' .. payload)
end
return 1"
    ))
});

/// KEYS: every work stream. ARGV: 1 group, 2 consumer, 3 first stream to
/// look at (0-based), 4 `>` (new messages) or `0` (this consumer's own
/// pending ones), 5 lease token, 6 lease ttl ms, 7 at most this many
/// messages, then per stream the key prefix of its partition's tasks, or
/// for the process-manager stream `pm|` and the prefix of its keys.
///
/// Reads up to that many messages for the consumer without blocking: from
/// the first stream, in turn from the given one, that has any. The caller
/// starts on every message it takes at once: a message read but not
/// started is kept alive by nobody, and if it waited behind a long step it
/// would be taken over and counted as a delivery that was never answered.
/// (So a read takes what the worker will work on now, not one per stream
/// as a plain `XREADGROUP` over several streams would.)
///
/// With `0` it reads what this consumer was given but may never have
/// received: a read whose reply was lost with its connection. Entries
/// deleted meanwhile are dropped from the pending list.
///
/// For a saga message whose task exists in the stream's partition, it
/// also takes the task's lease as `LOCK` does, in the same round trip: the
/// worker then starts on the task at once. The task's keys are built from
/// the partition's prefix and the id in the payload; they share the
/// stream's hash tag (one slot). Anything else (a process-manager message,
/// an entry that does not decode, a task not found there) is returned
/// without a lease, for the worker to deal with as before. Two messages of
/// one task in one read: the second finds the lease taken.
///
/// For a process-manager envelope that names its instance (a timeout) or
/// carries its routing key (`key`, `key_field`), it loads the instance the
/// handler will need, as `process_load` / `process_find` would.
///
/// Returns a list of {stream index, entry id, fields, delivery count,
/// loaded}; the fields raw, for the caller to decode. `loaded` is false
/// (nothing), {0, id} (the task's lease is held by another worker),
/// {fence, id, doc, version, cancel} (the task's lease, taken), or
/// {'pm', key, key field, doc, version} (an instance, or none: no doc).
pub static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{ROUTE_HASH_LUA}
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
      if not id then return {{'pm', key, field}} end
    else
      id = key
    end
  end
  if not here(m.process, id, k, n) then return false end
  local rec = redis.call('HMGET', tag .. ':inst:' .. m.process .. ':' .. id, 'doc', 'version')
  return {{'pm', key, field, rec[1], rec[2]}}
end
local function lease(prefix, fields)
  if prefix == '' then return false end
  local m = decoded(fields)
  if not m then return false end
  if string.sub(prefix, 1, 3) == 'pm|' then return instance(string.sub(prefix, 4), m) end
  if type(m.task_id) ~= 'string' then return false end
  local id = m.task_id
  if m.process ~= nil or not string.match(id, '^[0-9a-f%-]+$') then return false end
  -- The record first (the script is atomic): no lease for a task that
  -- does not exist here.
  local rec = redis.call('HMGET', prefix .. ':task:' .. id, 'doc', 'version')
  if not rec[1] then return false end
  if not redis.call('SET', prefix .. ':lock:' .. id, ARGV[5], 'NX', 'PX', ARGV[6]) then
    return {{0, id}}
  end
  local fence = redis.call('INCR', prefix .. ':fence:' .. id)
  return {{fence, id, rec[1], rec[2], redis.call('GET', prefix .. ':cancel:' .. id)}}
end
local n = #KEYS
local first = tonumber(ARGV[3])
local max = tonumber(ARGV[7])
local out = {{}}
for i = 0, n - 1 do
  local s = (first + i) % n
  local q = KEYS[s + 1]
  for _ = 1, 64 do
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', max - #out, 'STREAMS', q, ARGV[4])
    local entries = r and r[1][2]
    if not entries or #entries == 0 then break end
    local live = 0
    for _, e in ipairs(entries) do
      if e[2] then
        local count = 1
        if ARGV[4] ~= '>' then
          local p = redis.call('XPENDING', q, ARGV[1], e[1], e[1], 1)
          if p[1] then count = p[1][4] end
        end
        out[#out + 1] = {{s, e[1], e[2], count, lease(ARGV[8 + s], e[2])}}
        live = live + 1
      else
        redis.call('XACK', q, ARGV[1], e[1])
      end
    end
    -- Reading own pending entries again would return the same ones.
    if #out >= max or (ARGV[4] ~= '>' and live > 0) then break end
  end
  if #out >= max then break end
end
return out"
    ))
});

/// KEYS: queues (of one slot). ARGV: group, consumer, min idle ms, count.
///
/// Takes over messages whose consumer stopped settling them (its worker
/// died), from the first queue that has any. Returns {queue index (from
/// 0), entry id, delivery count (this one included), fields} per message;
/// entries deleted from the stream are dropped from the pending list. The fields are returned raw: an entry that does not decode
/// is the caller's to dead-letter, without holding the others up.
pub static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for s = 1, #KEYS do
  local pending = redis.call('XPENDING', KEYS[s], ARGV[1], 'IDLE', ARGV[3], '-', '+', ARGV[4])
  for _, p in ipairs(pending) do
    local claimed = redis.call('XCLAIM', KEYS[s], ARGV[1], ARGV[2], ARGV[3], p[1])
    if #claimed == 0 or not claimed[1][2] then
      redis.call('XACK', KEYS[s], ARGV[1], p[1])
    else
      out[#out + 1] = {s - 1, p[1], p[4] + 1, claimed[1][2]}
    end
  end
  if #out > 0 then return out end
end
return out",
    )
});

/// KEYS: queue, dead. ARGV: group, entry id, payload, reason, task id,
/// size ('' = not cut), dead-letter cap.
pub static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{SETTLE_FN}
local fields = {{'payload', ARGV[3], 'reason', ARGV[4], 'task', ARGV[5], 'at', now}}
if ARGV[6] ~= '' then table.insert(fields, 'size') table.insert(fields, ARGV[6]) end
-- The letter first: if Redis refuses it, the message is still pending.
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', unpack(fields))
settle(KEYS[1], ARGV[1], ARGV[2])
return id"
    ))
});

/// KEYS: dead, queue. ARGV: entry id. Moves a dead letter back onto the
/// queue; returns its fields, or nil.
pub static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return false end
local fields = e[1][2]
local payload = ''
for i = 1, #fields, 2 do
  if fields[i] == 'payload' then payload = fields[i + 1] end
end
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'payload', payload)
return fields",
    )
});

/// KEYS: cancel, task, queue. ARGV: now ms, token, channel, task id, wake
/// payload.
///
/// Records a cancellation request (`<ms>|<token>`), announces it, and
/// enqueues a wake-up message so that a task waiting for a delayed retry is
/// cancelled now. The flag expires with the task; nothing is written for a
/// task that does not exist. Returns nil for a new request (or the same
/// token's earlier one), else the earlier request's time.
pub static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local prev = redis.call('GET', KEYS[1])
if prev then
  local sep = string.find(prev, '|', 1, true)
  if sep and string.sub(prev, sep + 1) == ARGV[2] then return false end
  if sep then return string.sub(prev, 1, sep - 1) end
  return prev
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then return false end
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2])
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
redis.call('XADD', KEYS[3], '*', 'payload', ARGV[5])
return false",
    )
});

/// KEYS: (delayed, queue) pairs, all in one slot. ARGV: limit (per
/// pair). Moves due delayed messages onto their queues, each exactly once;
/// returns how many moved from the pair that moved most.
pub static RELEASE_DELAYED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{MOVE_DUE_FN}
local most = 0
for k = 1, #KEYS, 2 do
  local moved = move_due(KEYS[k], KEYS[k + 1], ARGV[1])
  if moved > most then most = moved end
end
return most"
    ))
});

/// KEYS: from queue, to queue. ARGV: group, entry id, consumer. Moves a
/// delivered entry, every field kept, to the other stream and settles it;
/// 1 if moved, 0 if the entry is no longer pending for `consumer` (another
/// took it over: it is theirs) or gone (it is settled all the same).
pub static SHARE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if not p[1] or p[1][2] ~= ARGV[3] then return 0 end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if #e == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', unpack(e[1][2]))
redis.call('XDEL', KEYS[1], ARGV[2])
return 1",
    )
});

/// KEYS: expiring. ARGV: limit. The members of tasks whose retention ran
/// out (`<id>|<status>|<saga>`).
pub static EXPIRED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])"
    ))
});

/// KEYS: expiring, then per task: task, fence, cancel, claims, lock, index
/// (all), index (its status when it expired), audit. ARGV: per task:
/// member, id, that status.
/// Removes every key and index entry of each task still due; returns how
/// many. A task whose record exists again was re-created under the same
/// id (a keyed start after the old one expired): only the old one's
/// leftovers go.
pub static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
local n = 0
for i = 1, #ARGV / 3 do
  local member, id, old = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local score = redis.call('ZSCORE', KEYS[1], member)
  local k = 1 + (i - 1) * 8
  if score and tonumber(score) <= now then
    local status = redis.call('HGET', KEYS[k + 1], 'status')
    local ttl = redis.call('PTTL', KEYS[k + 1])
    if status and status == old and ttl >= 0 then
      -- Due by the score but not expired yet (the two clocks may differ
      -- by a millisecond; `PTTL` answers 0 in the record's last
      -- millisecond): come back once it has, or the index entries would
      -- outlive the record.
      redis.call('ZADD', KEYS[1], now + ttl + 1, member)
    else
      if status then
        if status ~= old then redis.call('ZREM', KEYS[k + 7], id) end
      else
        redis.call('DEL', KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 8])
        redis.call('ZREM', KEYS[k + 6], id)
        redis.call('ZREM', KEYS[k + 7], id)
        n = n + 1
      end
      redis.call('ZREM', KEYS[1], member)
    end
  end
end
return n"
    ))
});

/// KEYS: dead. ARGV: keep ms ('' = no age limit). Trims the dead-letter
/// stream by age (and removes it once empty); returns how many entries
/// went. The count cap is applied from Rust, entry by entry.
pub static TRIM_DEAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
local n = 0
if ARGV[1] ~= '' then
  n = redis.call('XTRIM', KEYS[1], 'MINID', now - tonumber(ARGV[1]))
end
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return n"
    ))
});

/// KEYS: queue. ARGV: group, idle ms. Removes the consumers that hold no
/// message and have been idle that long (their workers left); checked and
/// removed in one step so that a consumer cannot take a message in
/// between. Returns how many.
pub static REAP_CONSUMERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
local n = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if tonumber(info['pending']) == 0 and tonumber(info['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    n = n + 1
  end
end
return n",
    )
});

/// KEYS: stream. ARGV: group, consumer. Removes the consumer from the group
/// if it holds no message. 1 if removed.
pub static LEAVE_GROUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] == ARGV[2] and tonumber(info['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
    return 1
  end
end
return 0",
    )
});

/// The process-manager commit. KEYS: instance, instance set, queue,
/// schedule, dead, then `n_add` correlation keys to claim, `n_rem` to
/// release, `n_ep` endpoint streams. ARGV: has instance, expected version,
/// doc, id, delete, n_add, n_rem, n_ep, n_enqueue, n_schedule, settle
/// ('none'|'ack'|'dead'), entry id, group, payload, reason, size ('' = not
/// cut), dead-letter cap, endpoint cap, the id of the message handled ('' =
/// none), tombstone TTL ms, the JSON array of the
/// message ids a deleted instance handled; then the enqueued payloads, the
/// endpoint payloads, and (due, payload) pairs. After the endpoint streams,
/// KEYS go on with the instance's tombstone and those of the `n_add` and
/// `n_rem` correlation entries, then each tally's hash, pending and
/// checked sets, then the open tallies (a sorted set, by expiry), then the
/// shared correlation entries (sets of instance ids) to join and to leave,
/// then the partition members (see `PM_QUEUE_FN`).
/// ARGV 22 is the number of tallies, 23 and 24 the numbers of shared
/// entries to join and leave, 25 the JSON array of the ids of the batched
/// messages (checked against tombstones like the one handled), 26 the JSON
/// array of their `[queue, entry id]` to acknowledge, 27 the instance's
/// generation (a stored one that differs is a conflict, as a version is),
/// 28 the JSON array, one per endpoint key, of the endpoint stream a
/// message is relayed to (spread layout: the key given is then the
/// partition's relay stream; `[]` when every endpoint key is the
/// endpoint's own stream); after the schedule pairs, each tally has:
/// its item count n, keep ms, completion, late completion, the queue its
/// completion goes to, n items, its member of the open tallies. The queue
/// is the delivery's (what the settle touches); each enqueued payload
/// comes after the queue it goes to (its partition's).
/// Returns {new version, then the entry id of each message left for
/// relaying} or {-2, stored version} / {-4, owner} on conflict, {-5} when
/// a tombstone remembers the message handled, {-6, i} when tally i exists
/// already.
pub static PROCESS_COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{SETTLE_FN}{PM_QUEUE_FN}
local nadd, nrem, nep = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local nenq, nsch = tonumber(ARGV[9]), tonumber(ARGV[10])
local tomb = 5 + nadd + nrem + nep + 1
local ntally, tk = tonumber(ARGV[22]), tomb + nadd + nrem
local sh, nsadd, nsrem = tk + 3 * ntally + 1, tonumber(ARGV[23]), tonumber(ARGV[24])
local parts = partitioned(KEYS[sh + nsadd + nsrem + 1])
local version = 0
if ARGV[1] == '1' then
  local stored = redis.call('HMGET', KEYS[1], 'version', 'gen')
  local v = stored[1] or '0'
  if v ~= ARGV[2] then return {{-2, v}} end
  -- The same version of another generation: deleted and created again
  -- since it was read.
  if stored[2] and ARGV[27] ~= '' and stored[2] ~= ARGV[27] then return {{-2, v}} end
  for t = 1, ntally do
    if redis.call('EXISTS', KEYS[tk + 3 * t - 2]) == 1 then return {{-6, t}} end
  end
  if ARGV[5] ~= '1' then
    local handled = cjson.decode(ARGV[25])
    if ARGV[19] ~= '' then table.insert(handled, ARGV[19]) end
    for _, m in ipairs(handled) do
      for i = 0, nadd do
        if redis.call('SISMEMBER', KEYS[tomb + i], m) == 1 then return {{-5}} end
      end
    end
  end
  for i = 1, nadd do
    local owner = redis.call('GET', KEYS[5 + i])
    if owner and owner ~= ARGV[4] then return {{-4, owner}} end
  end
  for i = 1, nrem do
    local k = KEYS[5 + nadd + i]
    if redis.call('GET', k) == ARGV[4] then redis.call('DEL', k) end
  end
  for i = 1, nsadd do redis.call('SADD', KEYS[sh + i], ARGV[4]) end
  for i = 1, nsrem do redis.call('SREM', KEYS[sh + nsadd + i], ARGV[4]) end
  if ARGV[5] == '1' then
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[2], ARGV[4])
    local handled = cjson.decode(ARGV[21])
    if #handled > 0 then
      local places = {{tomb}}
      for i = 1, nrem do places[#places + 1] = tomb + nadd + i end
      for _, k in ipairs(places) do
        redis.call('SADD', KEYS[k], unpack(handled))
        redis.call('PEXPIRE', KEYS[k], ARGV[20])
      end
    end
  else
    for i = 1, nadd do redis.call('SET', KEYS[5 + i], ARGV[4]) end
    version = tonumber(v) + 1
    redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'version', version, 'gen', ARGV[27])
    redis.call('SADD', KEYS[2], ARGV[4])
  end
end
local a = 28
for i = 1, nenq do
  redis.call('XADD', pm_queue(ARGV[a + 2 * i - 1], parts), '*', 'payload', ARGV[a + 2 * i])
end
a = a + 2 * nenq
local relays, relayed = cjson.decode(ARGV[28]), {{}}
for i = 1, nep do
  if relays[i] then
    relayed[#relayed + 1] = redis.call('XADD', KEYS[5 + nadd + nrem + i], '*', 'relay', relays[i], 'envelope', ARGV[a + i])
  else
    redis.call('XADD', KEYS[5 + nadd + nrem + i], 'MAXLEN', '~', ARGV[18], '*', 'envelope', ARGV[a + i])
  end
end
a = a + nep
for i = 1, nsch do redis.call('ZADD', KEYS[4], ARGV[a + 2 * i - 1], ARGV[a + 2 * i]) end
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
if ARGV[11] == 'dead' then
  local fields = {{'payload', ARGV[14], 'reason', ARGV[15], 'task', '', 'at', now}}
  if ARGV[16] ~= '' then table.insert(fields, 'size') table.insert(fields, ARGV[16]) end
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[17], '*', unpack(fields))
end
if ARGV[11] == 'ack' or ARGV[11] == 'dead' then settle(KEYS[3], ARGV[13], ARGV[12]) end
for _, b in ipairs(cjson.decode(ARGV[26])) do settle(b[1], ARGV[13], b[2]) end
local out = {{version}}
for _, id in ipairs(relayed) do out[#out + 1] = id end
return out"
    ))
});

/// KEYS: schedule, the shared process-manager queue, the partition
/// members (compact layout only). ARGV: now ms, limit, the process-manager
/// key prefix, the partition count. Moves due process-manager timeouts
/// onto their partitions' queues (the shared one for an entry that does
/// not decode, or while no engine reads partitions), each exactly once
/// (ZREM and XADD in one script). In the spread layout each partition has
/// a schedule of its own, whose timeouts are all for its instances: the
/// second key is then the partition's queue, and they all go there.
pub static RELEASE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{PM_QUEUE_FN}{ROUTE_HASH_LUA}
local compact = KEYS[3] ~= nil
local parts = partitioned(KEYS[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  local ok, decoded = pcall(cjson.decode, m)
  local queue = KEYS[2]
  if compact and parts and ok and type(decoded) == 'table' then
    queue = route(ARGV[3], tonumber(ARGV[4]), decoded)
  end
  redis.call('XADD', queue, '*', 'payload', m)
end
return #due"
    ))
});

/// KEYS: lease. ARGV: token, ttl ms. Takes or renews; 1 if held by token.
pub static NAMED_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if (not holder) or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0",
    )
});

/// KEYS: breaker. ARGV: probe ttl ms, token. A shared circuit breaker's
/// decision: {1, 0, counting} call (counting: failures are being counted),
/// {1, 1, 0} call as the probe (under token), {0, ms} open for ms more.
pub static BREAKER_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
if open_until == 0 then
  local failures = tonumber(redis.call('HGET', KEYS[1], 'failures') or '0')
  return {{1, 0, failures > 0 and 1 or 0}}
end
if now < open_until then return {{0, open_until - now}} end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
if now < probe_until then return {{0, probe_until - now}} end
redis.call('HSET', KEYS[1], 'probe_until', now + tonumber(ARGV[1]), 'probe', ARGV[2])
return {{1, 1, 0}}"
    ))
});

/// KEYS: breaker. ARGV: probe token ('' = not a probe), failed (0/1, '-' =
/// the call did not happen), threshold, open ms, keep ms. Records a call's
/// outcome (see `Breakers::breaker_report`); a probe whose slot has since
/// gone to another is ignored; the state expires after `keep` without
/// calls, so idle breakers go. Returns 1 if this report opened the
/// breaker, 2 if it closed it, 0 otherwise.
pub static BREAKER_REPORT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
local probe, failed = ARGV[1] ~= '', ARGV[2] == '1'
if probe then
  local out = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
  if out == 0 or redis.call('HGET', KEYS[1], 'probe') ~= ARGV[1] then return 0 end
end
if ARGV[2] == '-' then
  if probe and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'probe_until', 0) end
  return 0
end
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
local changed = 0
if not failed then
  if probe then redis.call('DEL', KEYS[1]) return 2 end
  if open_until == 0 and redis.call('HEXISTS', KEYS[1], 'failures') == 1 then
    redis.call('HSET', KEYS[1], 'failures', 0)
  end
elseif probe then
  redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[4]), 'probe_until', 0, 'failures', 0)
  changed = 1
elseif open_until == 0 then
  local f = redis.call('HINCRBY', KEYS[1], 'failures', 1)
  if f >= tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[4]), 'failures', 0)
    changed = 1
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
return changed"
    ))
});

/// KEYS: tally hash, pending, checked, process-manager queue (of the
/// instance's partition), open tallies, partition members. ARGV:
/// completed keep ms, the tally's member of open tallies, who calls
/// (`mover`: a check that moved an item and saw none left; `repair`).
/// Sends a tally's completion if every item is checked and it has not
/// been sent: called by a check that took an item and saw none left, by a
/// later check that finds it unsent (the first one died between its check
/// and this), and by housekeeping. {1} sent now (or, to the first mover
/// after a repair sent it, sent for it), {0} not (yet), {-1} gone.
pub static TALLY_FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{PM_QUEUE_FN}
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[5], ARGV[2])
  return -1
end
if redis.call('HGET', KEYS[1], 'done') == '1' then
  redis.call('ZREM', KEYS[5], ARGV[2])
  -- Sent by a check that moved no item (a repair racing the mover of the
  -- last one): that mover completed it, once.
  if ARGV[3] == 'mover' and redis.call('HGET', KEYS[1], 'sent_by') == 'repair' then
    redis.call('HSET', KEYS[1], 'sent_by', 'claimed')
    return 1
  end
  return 0
end
if redis.call('SCARD', KEYS[2]) > 0 then return 0 end
local late = redis.call('HGET', KEYS[1], 'late') == '1'
local completion = redis.call('HGET', KEYS[1], late and 'completion_late' or 'completion')
redis.call('XADD', pm_queue(KEYS[4], partitioned(KEYS[6])), '*', 'payload', completion)
redis.call('HSET', KEYS[1], 'done', 1, 'sent_by', ARGV[3])
for i = 1, 3 do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl == -1 or ttl > tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
end
redis.call('ZREM', KEYS[5], ARGV[2])
return 1"
    ))
});

/// KEYS: tally hash, pending. ARGV: how many missing items to list, mark
/// the deadline (1/0: only while items are unchecked, so that once the
/// last one is checked its completion's lateness is settled). {-1} no
/// tally, else {total, checked, done, late, {missing items}}.
pub static TALLY_PROGRESS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local done = redis.call('HGET', KEYS[1], 'done') == '1'
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
local left = redis.call('SCARD', KEYS[2])
if ARGV[2] == '1' and left > 0 then redis.call('HSET', KEYS[1], 'late', 1) end
local missing = {}
if left > 0 and tonumber(ARGV[1]) > 0 then missing = redis.call('SRANDMEMBER', KEYS[2], ARGV[1]) end
local late = redis.call('HGET', KEYS[1], 'late') == '1'
return {total, total - left, done and 1 or 0, late and 1 or 0, missing}",
    )
});

/// KEYS: endpoint stream. ARGV: group, consumer, claim idle ms. Takes a
/// message for the consumer without blocking: one another consumer has
/// left untouched for `claim idle` first (found anywhere in the group's
/// pending list, as the work queue's `CLAIM` does), else a new one;
/// creates the group (from the oldest message kept) if it does not exist.
/// {id, fields, deliveries} or {}.
pub static ENDPOINT_TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], '-', '+', 10)
if not ok then
  local why = type(pending) == 'table' and pending.err or tostring(pending)
  if not string.find(why, 'NOGROUP') then return redis.error_reply(why) end
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
  pending = {}
end
for _, p in ipairs(pending) do
  local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], p[1])
  if #claimed == 0 or not claimed[1][2] then
    -- Trimmed away (the stream's cap) while pending: nothing to deliver.
    redis.call('XACK', KEYS[1], ARGV[1], p[1])
  else
    return {p[1], claimed[1][2], p[4] + 1}
  end
end
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
if r and r[1] and r[1][2][1] then
  local n = r[1][2][1]
  return {n[1], n[2], 1}
end
return {}",
    )
});

/// KEYS: endpoint stream, its dead letters. ARGV: group, entry id, dead
/// (1/0), payload, reason, size ('' = not cut), dead-letter cap.
/// Acknowledges the entry, parking it first when dead.
pub static ENDPOINT_SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
if ARGV[3] == '1' then
  local fields = {{'payload', ARGV[4], 'reason', ARGV[5], 'at', now}}
  if ARGV[6] ~= '' then table.insert(fields, 'size') table.insert(fields, ARGV[6]) end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', unpack(fields))
end
local ok, n = pcall(redis.call, 'XACK', KEYS[1], ARGV[1], ARGV[2])
if ok then return n end
return 0"
    ))
});

/// KEYS: members. ARGV: owner lease prefix, member, ttl ms, partition
/// count, leaving (1/0), the process-manager key prefix ('' in the spread
/// layout, whose partitions are in other slots: the timer poller moves
/// their due hand-backs).
///
/// Balances the process-manager partitions over the live members (sorted
/// by name, member `r` of `n` gets the partitions `k` with `k % n == r`):
/// takes or renews those of `member` that are free or its own, lets go of
/// its others (their new owner takes them on its next call), and returns
/// the partitions it holds now, as a list (a bit mask built in Lua, whose
/// numbers are doubles, would lose partitions past 53). Leaving lets go of all of
/// them and of the membership. A partition is never held by two members:
/// an owner lease is taken only where none is. The owner also moves its
/// partitions' due hand-backs back onto them (as the timer poller does):
/// a poller of a version without partitions would not.
pub static BALANCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{MOVE_DUE_FN}
local me, ttl, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local rank, size = -1, 0
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[1], me)
else
  redis.call('ZADD', KEYS[1], now + ttl, me)
  local members = redis.call('ZRANGE', KEYS[1], 0, -1)
  table.sort(members)
  size = #members
  for i, m in ipairs(members) do if m == me then rank = i - 1 end end
end
local owned = {{}}
for k = 0, n - 1 do
  local key = ARGV[1] .. ':' .. k
  local owner = redis.call('GET', key)
  if rank >= 0 and k % size == rank then
    if not owner or owner == me then
      redis.call('SET', key, me, 'PX', ttl)
      owned[#owned + 1] = k
      if ARGV[6] ~= '' then
        move_due(ARGV[6] .. ':delayed:' .. k, ARGV[6] .. ':queue:' .. k, 256)
      end
    end
  elseif owner == me then
    redis.call('DEL', key)
  end
end
return owned"
    ))
});

/// KEYS: the queue (a partition's) of each message, then the partition
/// members (compact layout only). ARGV: the messages. Enqueues
/// process-manager messages on their partitions, or on the shared stream
/// while no engine reads partitions (see `PM_QUEUE_FN`).
pub static ENQUEUE_PM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}{PM_QUEUE_FN}
local parts = partitioned(KEYS[#ARGV + 1])
for i = 1, #ARGV do
  redis.call('XADD', pm_queue(KEYS[i], parts), '*', 'payload', ARGV[i])
end
return #ARGV"
    ))
});

/// KEYS: the runner sets of the process managers an engine runs. ARGV:
/// member, ttl ms ('' = leaving). Records the member in each until the
/// TTL runs out (or removes it), dropping expired members; a set outlives
/// its longest-lived member by a little, then expires.
pub static ANNOUNCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if ARGV[2] == '' then
    redis.call('ZREM', key, ARGV[1])
  else
    local ttl = tonumber(ARGV[2])
    redis.call('ZADD', key, now + ttl, ARGV[1])
  end
  -- The set outlives its longest-lived member (not the last announcer's
  -- TTL: a shorter one would cut the others' announcements).
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIREAT', key, tonumber(last[2]) + (tonumber(ARGV[2]) or 0) + 1000)
  end
end
return 1"
    ))
});

/// KEYS: a process manager's runner set. Returns how many engines that
/// run it announced themselves within their TTL.
pub static RUNNERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')"
    ))
});

/// KEYS: the saga readers (a sorted set by expiry). ARGV: member, ttl ms
/// ('' = leaving). Renews (or removes) the member, drops the expired ones,
/// and returns {its rank by name, how many there are} ({0, n} when
/// leaving): each reader watches the saga partitions `p` with
/// `p % n == rank` (see `watch`).
pub static READERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {{0, redis.call('ZCARD', KEYS[1])}}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(members)
local rank = 0
for i, m in ipairs(members) do if m == ARGV[1] then rank = i - 1 end end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
return {{rank, #members}}"
    ))
});

/// KEYS: a correlation entry, its tombstone, its claim marker. ARGV:
/// instance id, JSON array of the ids of the messages being handled, how
/// long a claim counts as in flight (ms).
///
/// Claims a correlation entry that lives in another slot than its
/// instance (spread layout), before the instance's commit; the marker
/// says for a while that the claim is in flight (its instance's commit
/// may not have landed yet), so that nobody takes the entry for stale
/// meanwhile. {1} claimed, {2} held already, {-4, owner, in flight 0/1}
/// held by another instance, {-5} the entry's tombstone remembers a
/// message being handled (a late duplicate).
pub static CLAIM_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
for _, m in ipairs(cjson.decode(ARGV[2])) do
  if redis.call('SISMEMBER', KEYS[2], m) == 1 then return {-5} end
end
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return {-4, owner, redis.call('EXISTS', KEYS[3])} end
if owner then return {2} end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
return {1}",
    )
});

/// KEYS: a correlation entry. ARGV: the owner it must have, the new owner
/// ('' = delete). Compare-and-set; 1 if done.
pub static SWAP_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1",
    )
});

/// KEYS: a set (a tombstone). ARGV: ttl ms, then members. Adds them and
/// sets the expiry.
pub static REMEMBER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if #ARGV < 2 then return 0 end
redis.call('SADD', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1",
    )
});
