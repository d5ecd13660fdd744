-- A tally's progress, and (when asked) marks its deadline passed: only
-- while items are unchecked, so that once the last one is checked its
-- completion's lateness is settled.
--
-- KEYS[1]: the tally
-- KEYS[2]: its unchecked items
-- ARGV[1]: how many unchecked items to list
-- ARGV[2]: '1' to mark the deadline passed
-- Returns: {GONE} (-1) no such tally, else {total, checked, done 0/1,
-- late 0/1, {unchecked items}}.
local tally = KEYS[1]
local pending = KEYS[2]
local list = ARGV[1]
local mark_deadline = ARGV[2]
local GONE = -1

if redis.call('EXISTS', tally) == 0 then return {GONE} end
local done = redis.call('HGET', tally, 'done') == '1'
local total = tonumber(redis.call('HGET', tally, 'total') or '0')
local left = redis.call('SCARD', pending)
if mark_deadline == '1' and left > 0 then redis.call('HSET', tally, 'late', 1) end
local missing = {}
if left > 0 and tonumber(list) > 0 then missing = redis.call('SRANDMEMBER', pending, list) end
local late = redis.call('HGET', tally, 'late') == '1'
return {total, total - left, done and 1 or 0, late and 1 or 0, missing}
