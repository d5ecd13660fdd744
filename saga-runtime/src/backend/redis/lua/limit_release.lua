-- Frees a holder's slot (by its token only: a second release, or that of
-- a slot that expired and went to another, frees nothing) and reserves
-- the slots found free for the first waiters in line.
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
-- ARGV[4]: the concurrency ('' = none)
-- Returns: {released (1 or 0), wake...}: the wakes of the waiters given a
-- reservation.
local holders = KEYS[1]
local line = KEYS[2]
local waiting = KEYS[3]
local waiters = KEYS[4]
local bookings = KEYS[5]
local state = KEYS[6]
local grace = ARGV[1]
local margin = ARGV[2]
local holder = ARGV[3]
local concurrency = tonumber(ARGV[4])

local L = limit_keys(holders, line, waiting, waiters, bookings, state, grace, margin)
local now = limit_clock()
limit_prune_slots(L, now)
local reply = {redis.call('ZREM', holders, holder)}
for _, w in ipairs(limit_promote(L, concurrency, now)) do table.insert(reply, w) end
limit_keep(L, now)
return reply
