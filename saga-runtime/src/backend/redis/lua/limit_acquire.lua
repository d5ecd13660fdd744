-- Asks to start one attempt under one limit (for one key): after the
-- prune and the reservations for waiters of slots found free
-- (limit_state.lua), a held slot is kept, a reservation taken, a free slot
-- taken unless others wait; a refused requester with a wake joins the
-- line (or keeps its place). Then the rate (GCRA over granted starts): an
-- early booking is told the rest of its wait; a due one starts if the
-- bucket allows, else is spaced after the due bookings ahead of it; a
-- newcomer starts if the bucket allows and no booking is owed (due within
-- LATE), else books the next free time after the last booking. A request
-- refused a slot spends no token.
--
-- KEYS[1]: the limit's slots (holders and reservations, by expiry)
-- KEYS[2]: its line (waiters by arrival)
-- KEYS[3]: its waiters by deadline
-- KEYS[4]: its waiters' records
-- KEYS[5]: its rate bookings (by due time)
-- KEYS[6]: its state (a hash: tat)
-- ARGV[1]: how long a booking is kept after it was due (us)
-- ARGV[2]: how long the keys outlive what they hold (us)
-- ARGV[3]: the concurrency ('' = none)
-- ARGV[4]: the rate's interval between starts (us; '' = no rate)
-- ARGV[5]: the rate's burst
-- ARGV[6]: how long after its due time a booking is owed its token (us)
-- ARGV[7]: the holder (unique to the attempt)
-- ARGV[8]: the waiter (stable across its parks)
-- ARGV[9]: how long a slot or reservation is held (us)
-- ARGV[10]: the wake string (absent: the requester does not queue)
-- Returns: {0, 0, 0, wake...} granted, or {cause, retry after (us), ahead,
-- wake...} with cause 1 (concurrency) or 2 (rate); the wakes are those of
-- waiters this call gave a reservation.
local holders = KEYS[1]
local line = KEYS[2]
local waiting = KEYS[3]
local waiters = KEYS[4]
local bookings = KEYS[5]
local state = KEYS[6]
local grace = ARGV[1]
local margin = ARGV[2]
local concurrency = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local late = tonumber(ARGV[6])
local holder = ARGV[7]
local waiter = ARGV[8]
local hold_arg = ARGV[9]
local wake = ARGV[10]

local GRANTED, CONCURRENCY, RATE = 0, 1, 2
local L = limit_keys(holders, line, waiting, waiters, bookings, state, grace, margin)
local hold = tonumber(hold_arg)
local now = limit_clock()

-- Refused a slot: joins the line (or keeps its place) when it can be
-- woken.
local function queue()
  local retry = limit_first_expiry(L, now)
  if not wake then return {CONCURRENCY, retry, redis.call('ZCARD', line)} end
  if not redis.call('ZSCORE', line, waiter) then
    local last = redis.call('ZRANGE', line, -1, -1, 'WITHSCORES')
    local arrival = 1
    if #last > 0 then arrival = tonumber(last[2]) + 1 end
    redis.call('ZADD', line, arrival, waiter)
  end
  redis.call('HSET', waiters, waiter, hold_arg .. ':' .. wake)
  local deadline = now + retry + hold
  redis.call('ZADD', waiting, deadline, waiter)
  limit_touch(L, 'line', deadline)
  return {CONCURRENCY, retry, redis.call('ZRANK', line, waiter)}
end

-- The earliest due time of a booking still owed its token (one due at
-- most LATE ago, `now - due < late`).
local function owed_from()
  return now - late + 1
end

-- The rate's decision: nil to start (a token is spent), or how long to
-- wait.
local function rate()
  local tat = tonumber(redis.call('HGET', state, 'tat') or '0')
  local free_at = tat - interval * (burst - 1)
  if free_at < now then free_at = now end
  local due = redis.call('ZSCORE', bookings, waiter)
  if due then
    due = tonumber(due)
    if due > now then return due - now end
    if free_at > now then
      -- Came back late with others: spaced after the owed ones ahead.
      local ahead = redis.call('ZCOUNT', bookings, owed_from(), due - 1)
      return free_at - now + interval * ahead
    end
    redis.call('ZREM', bookings, waiter)
  elseif free_at > now or redis.call('ZCOUNT', bookings, owed_from(), now) > 0 then
    local top = redis.call('ZRANGE', bookings, -1, -1, 'WITHSCORES')
    due = free_at
    if #top > 0 and tonumber(top[2]) + interval > due then due = tonumber(top[2]) + interval end
    if due <= now then due = now + interval end
    redis.call('ZADD', bookings, due, waiter)
    limit_touch(L, 'bookings', due + L.grace)
    return due - now
  end
  if tat < now then tat = now end
  redis.call('HSET', state, 'tat', tat + interval)
  limit_touch(L, 'state', tat + interval)
  return nil
end

local function decide(held)
  local reservation = 'w:' .. waiter
  local reserved = false
  if concurrency then
    if redis.call('ZSCORE', holders, holder) then return {GRANTED, 0, 0} end
    reserved = redis.call('ZSCORE', holders, reservation)
    if not reserved and held >= concurrency then return queue() end
  end
  if interval then
    local retry = rate()
    if retry then return {RATE, retry, 0} end
  end
  if concurrency then
    if reserved then redis.call('ZREM', holders, reservation) end
    limit_leave_line(L, waiter)
    redis.call('ZADD', holders, now + hold, holder)
    limit_touch(L, 'holders', now + hold)
  end
  return {GRANTED, 0, 0}
end

if concurrency then limit_prune_slots(L, now) end
if interval then limit_prune_bookings(L, now) end
local woken, held = limit_promote(L, concurrency, now)
local reply = decide(held)
limit_keep(L, now)
for _, w in ipairs(woken) do table.insert(reply, w) end
return reply
