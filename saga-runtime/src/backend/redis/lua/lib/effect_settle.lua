-- Effects `ack`, `dead` and `resolve` of a task write (apply.lua): the
-- message handled acknowledged; parked as a dead letter and acknowledged;
-- or a dead letter deleted (its task was requeued from it).
--
-- `ack`: keys the queue; arguments the entry, the consumer group.
-- `dead`: keys the queue, the dead letters; arguments the entry, the
-- group, the payload, the reason, its size ('' = not cut), the dead
-- letters' cap (`MAXLEN ~`).
-- `resolve`: keys the dead letters; arguments the entry.
-- Parsed at key `k` and argument `a`; returns what runs it and the next
-- key and argument.
local function effect_ack(keys, k, argv, a)
  local queue, entry, group = keys[k], argv[a], argv[a + 1]
  return function() settle(queue, group, entry) end, k + 1, a + 2
end
local function effect_dead(keys, k, argv, a)
  local queue, dead = keys[k], keys[k + 1]
  local entry, group, payload, reason, size, cap =
    argv[a], argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4], argv[a + 5]
  local run = function(w)
    local fields = {'payload', payload, 'reason', reason, 'task', w.id, 'at', w.now()}
    if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
    redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', unpack(fields))
    settle(queue, group, entry)
  end
  return run, k + 2, a + 6
end
local function effect_resolve(keys, k, argv, a)
  local dead, entry = keys[k], argv[a]
  return function() redis.call('XDEL', dead, entry) end, k + 1, a + 1
end
