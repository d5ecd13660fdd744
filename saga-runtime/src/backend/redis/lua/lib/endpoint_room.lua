-- An endpoint's stream is an outbox while a consumer group reads it (a
-- relay, a consumer): a message no group has settled is never trimmed
-- away, so a stream at its cap refuses more (the writer waits and tells)
-- instead of dropping its oldest. An endpoint no group reads is a log of
-- its newest `cap` messages (`MAXLEN =`, exactly, as on every store):
-- nobody misses what goes.

-- Whether stream `s` has a consumer group.
local function endpoint_read(s)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', s)
  return ok and #groups > 0
end

-- Whether stream `s` cannot take `n` more messages (1 when not given): it
-- would hold more than `cap`, and a group reads it.
local function endpoint_full(s, cap, n)
  if redis.call('XLEN', s) + (n or 1) <= tonumber(cap) then return false end
  return endpoint_read(s)
end

-- Appends `envelope` to endpoint stream `s` under `cap`; returns its id.
local function endpoint_append(s, cap, envelope)
  if endpoint_read(s) then
    return redis.call('XADD', s, '*', 'envelope', envelope)
  end
  return redis.call('XADD', s, 'MAXLEN', '=', cap, '*', 'envelope', envelope)
end
