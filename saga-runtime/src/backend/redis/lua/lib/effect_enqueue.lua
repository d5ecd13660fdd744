-- Effect `enqueue` of a task write (apply.lua): the task's next message,
-- on the queue now or among the delayed messages until its delay passed.
--
-- Keys: the partition's queue, its delayed messages. Arguments: the
-- payload, the delay (ms). Parsed (and the delay checked, before anything
-- is written) at key `k` and argument `a`; returns what runs it and the
-- next key and argument, or an error reply for a delay out of range.
local function effect_enqueue(keys, k, argv, a)
  local queue, delayed = keys[k], keys[k + 1]
  local payload, delay = argv[a], tonumber(argv[a + 1])
  if not delay or delay < 0 or delay > 1e13 then
    return redis.error_reply('delay out of range: ' .. argv[a + 1])
  end
  local run = function(w)
    if delay == 0 then
      redis.call('XADD', queue, '*', 'payload', payload)
    else
      redis.call('ZADD', delayed, w.now() + delay, '0:' .. payload)
    end
  end
  return run, k + 2, a + 2
end
