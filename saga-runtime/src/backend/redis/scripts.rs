//! The Lua scripts. Each one is a single atomic step of the protocol; each
//! touches only keys of one partition (see `keys.rs`).
//!
//! Error protocol for writes: a positive integer is the new version; `-1`
//! means the fencing token is stale (lock lost), `-2` a version conflict,
//! `-3` a missing task. The second element carries the stored value.

use std::sync::LazyLock;

use redis::Script;

/// KEYS: task, saga index, queue. ARGV: doc, id, payload.
pub static CREATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', 1)
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('XADD', KEYS[3], '*', 'payload', ARGV[3])
return 1",
    )
});

/// KEYS: lock, fence, task, cancel. ARGV: token, ttl ms, load (0/1).
/// Returns nil when locked, else {fence, doc, version, cancel}.
pub static LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
local fence = redis.call('INCR', KEYS[2])
if ARGV[3] ~= '1' then return {fence} end
local rec = redis.call('HMGET', KEYS[3], 'doc', 'version')
return {fence, rec[1], rec[2], redis.call('GET', KEYS[4])}",
    )
});

const CHECK: &str = r"
local f = redis.call('GET', KEYS[1])
if f ~= ARGV[1] then return {-1, f} end
local v = redis.call('HGET', KEYS[2], 'version')
if not v then return {-3, false} end
if v ~= ARGV[2] then return {-2, v} end
";

const WRITE: &str = r"
local nv = tonumber(v) + 1
redis.call('HSET', KEYS[2], 'doc', ARGV[3], 'version', nv)
";

/// KEYS: fence, task, idempotency key. ARGV: fence, version, doc, ttl ms.
/// Returns {new version, claimed 0/1}.
pub static SAVE_AND_CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{CHECK}{WRITE}
local claimed = redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4])
if claimed then return {{nv, 1}} end
return {{nv, 0}}"
    ))
});

/// KEYS: fence, task, lock, queue, dead, cancel.
/// ARGV: fence, version, doc, token, next payload ('' = none), settle
/// ('none'|'ack'|'dead'|'resolve'), entry id, group, payload, reason, task id,
/// at, unless-cancelled ('1' refuses the write with {-5, at} if the cancel
/// flag is set). Returns {new version}.
pub static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{CHECK}
if ARGV[13] == '1' then
  local c = redis.call('GET', KEYS[6])
  if c then return {{-5, c}} end
end
{WRITE}
if ARGV[5] ~= '' then redis.call('XADD', KEYS[4], '*', 'payload', ARGV[5]) end
if ARGV[6] == 'ack' or ARGV[6] == 'dead' then
  redis.call('XACK', KEYS[4], ARGV[8], ARGV[7])
  redis.call('XDEL', KEYS[4], ARGV[7])
end
if ARGV[6] == 'dead' then
  redis.call('XADD', KEYS[5], '*', 'payload', ARGV[9], 'reason', ARGV[10], 'task', ARGV[11], 'at', ARGV[12])
end
if ARGV[6] == 'resolve' then redis.call('XDEL', KEYS[5], ARGV[7]) end
if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
return {{nv}}"
    ))
});

/// KEYS: lock, queue, cancel. ARGV: token, ttl ms, group, consumer, entry id.
/// Extends the lock, resets the message's idle time, reads the cancel flag.
/// Returns {held 0/1, cancel}.
pub static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local held = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  held = 1
end
redis.call('XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, ARGV[5], 'JUSTID')
return {held, redis.call('GET', KEYS[3])}",
    )
});

/// KEYS: lock. ARGV: token, ttl ms. Returns 1 if extended.
pub static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0",
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
    Script::new(
        r"
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return redis.call('XDEL', KEYS[1], ARGV[2])",
    )
});

/// KEYS: queue, dead. ARGV: group, entry id, payload, reason, task id, at.
pub static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return redis.call('XADD', KEYS[2], '*', 'payload', ARGV[3], 'reason', ARGV[4], 'task', ARGV[5], 'at', ARGV[6])",
    )
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

/// KEYS: cancel. ARGV: now ms, channel, task id. Returns the earlier
/// request's time, or nil (and publishes) for the first request.
pub static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local prev = redis.call('GET', KEYS[1])
if prev then return prev end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return false",
    )
});

/// The process-manager commit. KEYS: instance, instance set, queue,
/// schedule, dead, then `n_add` correlation keys to claim, `n_rem` to
/// release, `n_ep` endpoint streams. ARGV: has instance, expected version,
/// doc, id, delete, n_add, n_rem, n_ep, n_enqueue, n_schedule, settle
/// ('none'|'ack'|'dead'), entry id, group, payload, reason, at; then the
/// enqueued payloads, the endpoint payloads, and (due, payload) pairs.
/// Returns {new version} or {-2, stored version} / {-4, owner} on conflict.
pub static PROCESS_COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local nadd, nrem, nep = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local nenq, nsch = tonumber(ARGV[9]), tonumber(ARGV[10])
local version = 0
if ARGV[1] == '1' then
  local v = redis.call('HGET', KEYS[1], 'version') or '0'
  if v ~= ARGV[2] then return {-2, v} end
  for i = 1, nadd do
    local owner = redis.call('GET', KEYS[5 + i])
    if owner and owner ~= ARGV[4] then return {-4, owner} end
  end
  for i = 1, nrem do
    local k = KEYS[5 + nadd + i]
    if redis.call('GET', k) == ARGV[4] then redis.call('DEL', k) end
  end
  if ARGV[5] == '1' then
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[2], ARGV[4])
  else
    for i = 1, nadd do redis.call('SET', KEYS[5 + i], ARGV[4]) end
    version = tonumber(v) + 1
    redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'version', version)
    redis.call('SADD', KEYS[2], ARGV[4])
  end
end
local a = 16
for i = 1, nenq do redis.call('XADD', KEYS[3], '*', 'payload', ARGV[a + i]) end
a = a + nenq
for i = 1, nep do redis.call('XADD', KEYS[5 + nadd + nrem + i], '*', 'payload', ARGV[a + i]) end
a = a + nep
for i = 1, nsch do redis.call('ZADD', KEYS[4], ARGV[a + 2 * i - 1], ARGV[a + 2 * i]) end
if ARGV[11] == 'ack' or ARGV[11] == 'dead' then
  redis.call('XACK', KEYS[3], ARGV[13], ARGV[12])
  redis.call('XDEL', KEYS[3], ARGV[12])
end
if ARGV[11] == 'dead' then
  redis.call('XADD', KEYS[5], '*', 'payload', ARGV[14], 'reason', ARGV[15], 'task', '', 'at', ARGV[16])
end
return {version}",
    )
});

/// KEYS: schedule, queue. ARGV: now ms, limit. Moves due entries onto the
/// queue, each exactly once (ZREM and XADD in one script).
pub static RELEASE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('XADD', KEYS[2], '*', 'payload', m)
end
return #due",
    )
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
