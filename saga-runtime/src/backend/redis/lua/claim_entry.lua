-- Claims a correlation entry that lives in another slot than its instance
-- (spread layout), before the instance's commit; the claim marker says
-- for a while that the claim is in flight (its instance's commit may not
-- have landed yet), so that nobody takes the entry for stale meanwhile.
--
-- KEYS[1]: the correlation entry (its owner's instance id)
-- KEYS[2]: its tombstone (the message ids its deleted owners handled)
-- KEYS[3]: its claim marker
-- ARGV[1]: the instance id
-- ARGV[2]: the JSON array of the ids of the messages being handled
-- ARGV[3]: how long a claim counts as in flight (ms)
-- Returns: {1} claimed, {2} held already, or a refusal: {TAKEN, owner,
-- 1 if its claim is in flight else 0} held by another instance,
-- {TOMBSTONED} the tombstone remembers a message being handled (a late
-- duplicate).
local entry = KEYS[1]
local tombstone = KEYS[2]
local marker = KEYS[3]
local id = ARGV[1]
local handled = ARGV[2]
local in_flight = ARGV[3]

for _, m in ipairs(cjson.decode(handled)) do
  if redis.call('SISMEMBER', tombstone, m) == 1 then return {TOMBSTONED} end
end
local owner = redis.call('GET', entry)
if owner and owner ~= id then return {TAKEN, owner, redis.call('EXISTS', marker)} end
if owner then return {2} end
redis.call('SET', entry, id)
redis.call('SET', marker, id, 'PX', in_flight)
return {1}
