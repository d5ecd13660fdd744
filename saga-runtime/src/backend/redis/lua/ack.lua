-- Acknowledges and deletes a delivered message (settle.lua).
--
-- KEYS[1]: the queue
-- ARGV[1]: the consumer group
-- ARGV[2]: the entry id
-- Returns: 1 if it was pending, else 0.
local queue = KEYS[1]
local group = ARGV[1]
local entry = ARGV[2]

return settle(queue, group, entry)
