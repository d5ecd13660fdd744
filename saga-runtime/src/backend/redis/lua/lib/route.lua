-- The routing hash of process-manager messages, computed alike here and in
-- Rust (`keys::route_hash`): a polynomial hash modulo a prime below 2^31,
-- which Lua's doubles compute exactly.
local function route_hash(s)
  local h = 0
  for i = 1, #s do h = (h * 31 + string.byte(s, i)) % 2147483647 end
  return h
end

-- The queue key of decoded envelope `m` under process-manager key prefix
-- `pm_prefix`, of `partitions` partitions.
local function route(pm_prefix, partitions, m)
  local target = m.instance_id
  if type(target) ~= 'string' then target = m.key end
  if type(target) ~= 'string' then target = '' end
  local process = m.process
  if type(process) ~= 'string' then return pm_prefix .. ':queue' end
  return pm_prefix .. ':queue:' .. (route_hash(process .. ':' .. target) % partitions)
end
