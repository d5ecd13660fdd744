-- Moves a dead letter back onto its queue (its payload, as a new message).
--
-- KEYS[1]: the dead letters
-- KEYS[2]: the queue
-- ARGV[1]: the dead letter's entry id
-- Returns: the dead letter's fields, or nil when there is none.
local dead = KEYS[1]
local queue = KEYS[2]
local entry = ARGV[1]

local e = redis.call('XRANGE', dead, entry, entry)
if #e == 0 then return false end
local fields = e[1][2]
local payload = ''
for i = 1, #fields, 2 do
  if fields[i] == 'payload' then payload = fields[i + 1] end
end
redis.call('XDEL', dead, entry)
redis.call('XADD', queue, '*', 'payload', payload)
return fields
