-- Trims a dead-letter stream by age, by the server's time (and removes it
-- once empty). The count cap is applied from Rust, entry by entry.
--
-- KEYS[1]: the dead letters
-- ARGV[1]: how long a dead letter is kept (ms; '' = no age limit)
-- Returns: how many entries went.
local dead = KEYS[1]
local keep = ARGV[1]

local now = server_time()
local n = 0
if keep ~= '' then
  n = redis.call('XTRIM', dead, 'MINID', now - tonumber(keep))
end
if redis.call('XLEN', dead) == 0 then redis.call('DEL', dead) end
return n
