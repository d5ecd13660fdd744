-- A limit's use now, after the prune (expired slots, lapsed waiters and
-- stale bookings are not counted).
--
-- KEYS[1]: the limit's slots (holders and reservations, by expiry)
-- KEYS[2]: its line (waiters by arrival)
-- KEYS[3]: its waiters by deadline
-- KEYS[4]: its waiters' records
-- KEYS[5]: its rate bookings (by due time)
-- KEYS[6]: its state (a hash: tat)
-- ARGV[1]: how long a booking is kept after it was due (us)
-- ARGV[2]: how long the keys outlive what they hold (us)
-- Returns: {slots held or reserved, waiters in line, rate tokens booked}.
local holders = KEYS[1]
local line = KEYS[2]
local waiting = KEYS[3]
local waiters = KEYS[4]
local bookings = KEYS[5]
local state = KEYS[6]
local grace = ARGV[1]
local margin = ARGV[2]

local L = limit_keys(holders, line, waiting, waiters, bookings, state, grace, margin)
local now = limit_clock()
limit_prune_slots(L, now)
limit_prune_bookings(L, now)
return {
  redis.call('ZCARD', holders), redis.call('HLEN', waiters), redis.call('ZCARD', bookings),
}
