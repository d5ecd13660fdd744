-- Moves a delivered entry, every field kept, to another stream (the
-- shared one of its process-manager partition) and settles it.
--
-- KEYS[1]: the stream it was delivered from
-- KEYS[2]: the stream it goes to
-- ARGV[1]: the consumer group
-- ARGV[2]: the entry id
-- ARGV[3]: the consumer
-- Returns: 1 if moved, 0 if the entry is no longer pending for the
-- consumer (another took it over: it is theirs) or gone (it is settled
-- all the same).
local from = KEYS[1]
local to = KEYS[2]
local group = ARGV[1]
local entry = ARGV[2]
local consumer = ARGV[3]

local p = redis.call('XPENDING', from, group, entry, entry, 1)
if not p[1] or p[1][2] ~= consumer then return 0 end
local e = redis.call('XRANGE', from, entry, entry)
redis.call('XACK', from, group, entry)
if #e == 0 then return 0 end
redis.call('XADD', to, '*', unpack(e[1][2]))
redis.call('XDEL', from, entry)
return 1
