-- Messages held for an instance that does not exist yet (a continuing
-- message that found none): per value they wait for, a list of their
-- message ids in the order held (`l`) and a hash of each one's payload
-- (`h`), which is also its member of the schedule (`s`), due when its
-- hold ends. A held message is there until one of: the write that
-- creates its instance or claims its value releases it (moves it from
-- the schedule onto queue `q`: `release_held`), or its hold ends (the
-- timer poller moves it like a timeout; the ids left behind are pruned by
-- the next hold and expire with the list).

-- Moves the messages held in `l`/`h` that are still scheduled in `s` onto
-- queue `q` (through `pm_queue`: `parts` as `partitioned` answered), in
-- the order they were held, and forgets them; returns how many moved.
local function release_held(l, h, s, q, parts)
  local ids = redis.call('LRANGE', l, 0, -1)
  local moved = 0
  for _, m in ipairs(ids) do
    local payload = redis.call('HGET', h, m)
    if payload and redis.call('ZREM', s, payload) == 1 then
      redis.call('XADD', pm_queue(q, parts), '*', 'payload', payload)
      moved = moved + 1
    end
  end
  if #ids > 0 then redis.call('DEL', l, h) end
  return moved
end

-- Drops from `l`/`h` the ids whose payload is no longer scheduled in `s`
-- (their hold ended, or they were released); returns the ids left, in
-- order.
local function held_now(l, h, s)
  local left = {}
  for _, m in ipairs(redis.call('LRANGE', l, 0, -1)) do
    local payload = redis.call('HGET', h, m)
    if payload and redis.call('ZSCORE', s, payload) then
      left[#left + 1] = m
    else
      redis.call('LREM', l, 0, m)
      redis.call('HDEL', h, m)
    end
  end
  return left
end
