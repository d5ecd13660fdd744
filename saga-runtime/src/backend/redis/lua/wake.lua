-- Makes a parked saga message due now: the delayed entry the commit that
-- parked it left (`0:<payload>`, lib/effect_enqueue.lua) moves onto the queue, once
-- (ZREM, then XADD, as move_due.lua does). An entry already due but not
-- yet moved by the timer poller moves too: the slot reserved for its
-- waiter must not lapse while it waits for the poller.
--
-- KEYS[1]: the partition's delayed messages
-- KEYS[2]: the partition's queue
-- ARGV[1]: the message's payload
-- Returns: 1 if this call moved it, 0 if it was not there (moved by the
-- poller or an earlier wake, taken, or gone).
local delayed = KEYS[1]
local queue = KEYS[2]
local payload = ARGV[1]

if redis.call('ZREM', delayed, '0:' .. payload) == 0 then return 0 end
redis.call('XADD', queue, '*', 'payload', payload)
return 1
