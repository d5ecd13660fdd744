-- Extends a holder's slot; an expired holder (whose slot may be another's
-- by now) renews nothing. Nothing else is read, so nothing is pruned: the
-- next call that reads the slots prunes them.
--
-- KEYS[1]: the limit's slots (holders and reservations, by expiry)
-- KEYS[2]: its line (waiters by arrival)
-- KEYS[3]: its waiters by deadline
-- KEYS[4]: its waiters' records
-- KEYS[5]: its rate bookings (by due time)
-- KEYS[6]: its state (a hash: tat)
-- ARGV[1]: how long a booking is kept after it was due (us)
-- ARGV[2]: how long the keys outlive what they hold (us)
-- ARGV[3]: the holder
-- ARGV[4]: how long the slot is held from now (us)
-- Returns: 1 if the holder holds a slot (now extended), else 0.
local holders = KEYS[1]
local line = KEYS[2]
local waiting = KEYS[3]
local waiters = KEYS[4]
local bookings = KEYS[5]
local state = KEYS[6]
local grace = ARGV[1]
local margin = ARGV[2]
local holder = ARGV[3]
local hold = tonumber(ARGV[4])

local L = limit_keys(holders, line, waiting, waiters, bookings, state, grace, margin)
local now = limit_clock()
local expiry = redis.call('ZSCORE', holders, holder)
if not expiry or tonumber(expiry) <= now then return 0 end
redis.call('ZADD', holders, now + hold, holder)
limit_touch(L, 'holders', now + hold)
limit_keep(L, now)
return 1
