-- Releases the messages held for a correlation value whose entry lives
-- in another slot than the instance that claimed it (spread layout),
-- once that instance's commit has landed: see lib/held.lua. (A release
-- lost with its process leaves them to their hold's end, when they are
-- delivered like a timeout and find the instance.)
--
-- KEYS[1]: the held ids of the value
-- KEYS[2]: their payloads
-- KEYS[3]: the value's partition's schedule
-- ARGV[1]: the value's partition's queue
-- Returns: how many moved.
local list = KEYS[1]
local payloads = KEYS[2]
local schedule = KEYS[3]
local queue = ARGV[1]

return release_held(list, payloads, schedule, queue, true)
