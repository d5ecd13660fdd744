-- Effect `claim` of a task write (apply.lua): an attempt's name claimed;
-- the reply says whether the claim is new. In record layout 2 the claim
-- is a field of the record, read with the guards and written with `put`
-- (here when the write puts nothing); in layout 1 it is taken here, in the
-- task's claims hash.
--
-- Keys: the task's claims. Arguments: the claim. Parsed at key `k` and
-- argument `a`; returns what runs it, the next key and argument, and the
-- claim (the guards read it in layout 2).
local function effect_claim(keys, k, argv, a)
  local claims_key, claim = keys[k], argv[a]
  local run = function(w)
    w.claimed_now = claim_attempt(w.apart, claims_key, claim, w.claimed)
    -- In layout 2 the claim's field goes with the record's `put`; a
    -- write that puts nothing takes it here.
    if w.apart and not w.put and w.claimed_now == 1 then
      redis.call('HSET', w.task_key, 'c:' .. claim, 1)
    end
  end
  return run, k + 1, a + 1, claim
end
