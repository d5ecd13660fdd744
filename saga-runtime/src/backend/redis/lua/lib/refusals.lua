-- Refusal codes: how a script says no. A refused write answers
-- {code, detail} and has written nothing (every check comes before the
-- first write). The table is `RefusalCode` in `scripts/refusal.rs`; a test
-- checks that the two agree, name for name and code for code. Task writes
-- and process-manager writes each answer a set of them in which no code
-- repeats (-5 is a cancellation to the one, a tombstone to the other).
local LOCK_LOST = -1
local CONFLICT = -2
local MISSING = -3
local TAKEN = -4
local CANCEL_REQUESTED = -5
local TOMBSTONED = -5
local TALLY_EXISTS = -6
local HOLD_FULL = -7
local ENDPOINT_FULL = -8
