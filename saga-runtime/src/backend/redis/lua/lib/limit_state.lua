-- The state of one flow-control limit for one key (`backend/limits.rs`
-- has the protocol; the limit machine, `limit/machine.rs`, is the reference these
-- functions mirror, step by step). Times are the server's, in
-- microseconds: a rate's interval (`per / count`) is kept that finely, so
-- that rounding adds no start over a long window.
--
-- `L` names the limit's keys, all under one hash tag:
--   L.holders:  held slots and reservations (`w:<waiter>`), by expiry
--   L.line:     the waiters in line, by arrival number (the last's + 1)
--   L.waiting:  the same waiters, by the deadline they must ask again by
--   L.waiters:  waiter -> '<hold for (us)>:<wake>'
--   L.bookings: booked rate tokens, waiter -> when due
--   L.state:    a hash: `tat` (the rate's theoretical arrival time, GCRA)
-- and L.grace (how long after it was due a booking is kept), L.margin
-- (how long the keys outlive what they hold), both in us.
-- Numbers are never concatenated into strings (Lua would write them with
-- 14 digits): they go to Redis as arguments, which it writes exactly.
--
-- Each call does only what its answer needs: it prunes the structures it
-- reads (a renewal reads one score), and sets an expiry only on the keys
-- it wrote, only when it must move later (limit_keep). Every key is
-- bounded all the same: whatever it holds is pruned by the next call that
-- reads it, and it expires at most two margins after the last thing it
-- holds lapses.

-- The server's time in microseconds (`TIME`).
local function limit_clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Notes that `group` ('holders', 'line' (its three keys), 'bookings' or
-- 'state') now holds something until `last` (us), for limit_keep.
local function limit_touch(L, group, last)
  local seen = L['until_' .. group]
  if not seen or last > seen then L['until_' .. group] = last end
end

-- Takes `waiter` out of the line (and its record); whether it was in it.
-- The line's three keys hold the same waiters (written together, pruned
-- together, expiring together), so the record tells.
local function limit_leave_line(L, waiter)
  if redis.call('HDEL', L.waiters, waiter) == 0 then return false end
  redis.call('ZREM', L.line, waiter)
  redis.call('ZREM', L.waiting, waiter)
  return true
end

-- Drops expired slots and lapsed waiters.
local function limit_prune_slots(L, now)
  redis.call('ZREMRANGEBYSCORE', L.holders, '-inf', now)
  local lapsed = redis.call('ZRANGEBYSCORE', L.waiting, '-inf', now - 1)
  for _, waiter in ipairs(lapsed) do
    redis.call('HDEL', L.waiters, waiter)
    redis.call('ZREM', L.line, waiter)
    redis.call('ZREM', L.waiting, waiter)
  end
end

-- Drops the bookings not claimed within the grace.
local function limit_prune_bookings(L, now)
  redis.call('ZREMRANGEBYSCORE', L.bookings, '-inf', now - L.grace)
end

-- Reserves free slots (of `concurrency`, nil for none) for the first
-- waiters in line: their wakes, and the slots held (or reserved) after.
local function limit_promote(L, concurrency, now)
  local wake = {}
  if not concurrency then return wake, 0 end
  local held = redis.call('ZCARD', L.holders)
  while held < concurrency do
    local first = redis.call('ZRANGE', L.line, 0, concurrency - held - 1)
    if #first == 0 then break end
    for _, waiter in ipairs(first) do
      local record = redis.call('HGET', L.waiters, waiter)
      if record then
        limit_leave_line(L, waiter)
        local sep = string.find(record, ':', 1, true)
        local expiry = now + tonumber(string.sub(record, 1, sep - 1))
        held = held + redis.call('ZADD', L.holders, expiry, 'w:' .. waiter)
        limit_touch(L, 'holders', expiry)
        table.insert(wake, string.sub(record, sep + 1))
      else
        redis.call('ZREM', L.line, waiter)
      end
    end
  end
  return wake, held
end

-- How long until the first held slot (or reservation) expires: at least
-- a millisecond.
local function limit_first_expiry(L, now)
  local first = redis.call('ZRANGE', L.holders, 0, 0, 'WITHSCORES')
  local left = 1000
  if #first > 0 then left = tonumber(first[2]) - now end
  if left < 1000 then left = 1000 end
  return left
end

-- After a call: each group of keys it wrote lives at least a margin past
-- the last thing it wrote there. The expiry only moves later, and then
-- by one margin more than needed, so most calls read one PTTL per group
-- written and set nothing; a key that no longer exists (emptied) is left.
-- The line's three keys always get the same expiry.
local function limit_keep_group(L, now, last, key, ...)
  if not last then return end
  local left = redis.call('PTTL', key)
  local want = math.ceil((last + L.margin) / 1000)
  if left == -1 or (left >= 0 and math.floor(now / 1000) + left < want) then
    local at = want + L.margin / 1000
    redis.call('PEXPIREAT', key, at)
    for _, other in ipairs({...}) do redis.call('PEXPIREAT', other, at) end
  end
end

local function limit_keep(L, now)
  limit_keep_group(L, now, L.until_holders, L.holders)
  limit_keep_group(L, now, L.until_line, L.waiting, L.line, L.waiters)
  limit_keep_group(L, now, L.until_bookings, L.bookings)
  limit_keep_group(L, now, L.until_state, L.state)
end

-- The limit's keys (in the order the scripts take them), the grace and
-- the margin.
local function limit_keys(holders, line, waiting, waiters, bookings, state, grace, margin)
  return {
    holders = holders, line = line, waiting = waiting, waiters = waiters,
    bookings = bookings, state = state, grace = tonumber(grace), margin = tonumber(margin),
  }
end
