-- Moves due delayed messages onto their queues (move_due.lua), each
-- exactly once.
--
-- KEYS[1..]: (delayed messages, queue) pairs, all in one slot
-- ARGV[1]: at most this many messages per pair
-- Returns: how many moved from the pair that moved most.
local limit = ARGV[1]

local now = server_time()
local most = 0
for k = 1, #KEYS, 2 do
  local moved = move_due(KEYS[k], KEYS[k + 1], limit, now)
  if moved > most then most = moved end
end
return most
