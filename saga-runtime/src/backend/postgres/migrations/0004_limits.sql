-- Flow-control limits (`#[limit]`): concurrency slots and start rates per
-- limit name and optional key, and the wake of a parked task. `{schema}`
-- is the backend's schema (quoted when substituted).
--
-- The protocol is `backend/limits.rs`'s, decided exactly as the in-memory
-- backend decides it (`backend/memory/limits.rs`): each function below is
-- one of its methods, one statement and one transaction. Every call on a
-- (limit, key) first locks that pair's row in `limits` (created by the
-- first request), so that calls on one pair run one at a time and calls
-- on different pairs never wait for each other. Every time that decides
-- an expiry is the server's (clock_timestamp(), read once the lock is
-- held), never an engine's. Durations travel in microseconds (the
-- resolution of a timestamp).
--
-- What stays bounded, and why:
-- - limit_holders: the slots of a pair (at most its concurrency, plus
--   reservations, which take slots too); every call on the pair first
--   deletes those expired.
-- - limit_waiters: the pair's line; every call deletes the waiters past
--   their deadline (the wait they were told plus their hold), and one
--   leaves the line when it starts, is promoted, or leaves (`limit_leave`).
-- - limit_bookings: a rate's booked tokens, one per waiter told to come
--   back; every call deletes those unclaimed `BOOKING_GRACE` after due,
--   and a waiter's goes when it starts or leaves.
-- - limits: a row per pair while it holds anything (or its rate's next
--   token is in the future); the call that finds it idle deletes it, as
--   the in-memory backend drops an idle pair. A pair nobody calls again
--   after its holders died keeps its rows until `limits_sweep` (from
--   housekeeping) finds them run out.

-- A (limit, key) pair: the row every call on the pair locks first, with
-- the rate's theoretical arrival time (GCRA) and the line's last arrival
-- number. The unkeyed use of a name (`keyed` false, `key` '') is a pair of
-- its own, apart from every key.
CREATE TABLE {schema}.limits (
    id bigserial PRIMARY KEY,
    name text NOT NULL,
    keyed boolean NOT NULL,
    key text NOT NULL,
    tat timestamptz,
    arrivals bigint NOT NULL DEFAULT 0,
    UNIQUE (name, keyed, key)
)
-- Room for the row's new version (every start under a rate moves `tat`):
-- a heap-only update.
WITH (fillfactor = 80);

-- Held slots, and reservations (`w:{waiter}`) for the first waiters in
-- line when a slot freed, each until it expires. No index on the expiry:
-- a pair holds at most its concurrency, and a renewal stays heap-only.
CREATE TABLE {schema}.limit_holders (
    limit_id bigint NOT NULL,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (limit_id, holder)
)
WITH (fillfactor = 80);

-- The line: waiters refused a slot that can be woken, in arrival order,
-- each until its deadline, with the hold its reservation gets and what
-- wakes it.
CREATE TABLE {schema}.limit_waiters (
    limit_id bigint NOT NULL,
    waiter text NOT NULL,
    arrival bigint NOT NULL,
    deadline timestamptz NOT NULL,
    hold_us bigint NOT NULL,
    wake text NOT NULL,
    PRIMARY KEY (limit_id, waiter),
    UNIQUE (limit_id, arrival)
);

-- A rate's booked tokens: the waiter starts on it at or after `due`.
CREATE TABLE {schema}.limit_bookings (
    limit_id bigint NOT NULL,
    waiter text NOT NULL,
    due timestamptz NOT NULL,
    PRIMARY KEY (limit_id, waiter)
);

-- Microseconds from `p_now` until `p_until`, rounded up: a caller told to
-- come back after it must not come back before.
CREATE FUNCTION {schema}.us_until(p_until timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT ceil(extract(epoch FROM (p_until - p_now)) * 1000000)::bigint;
$$;

-- `p_us` microseconds as an interval (hours at most, never days: adding
-- it to a time is exact whatever the server's time zone).
CREATE FUNCTION {schema}.us(p_us bigint) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_us * interval '1 microsecond';
$$;

-- Locks the pair's row, creating it when `p_create`; a row of NULLs when
-- it does not exist and is not created. A row being deleted (its pair
-- went idle) is waited for and then not found, and made again.
CREATE FUNCTION {schema}.limit_lock(p_name text, p_key text, p_create boolean)
RETURNS {schema}.limits LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
BEGIN
    LOOP
        SELECT * INTO l FROM {schema}.limits
        WHERE name = p_name AND keyed = (p_key IS NOT NULL) AND key = COALESCE(p_key, '')
        FOR UPDATE;
        IF FOUND OR NOT p_create THEN
            RETURN l;
        END IF;
        -- Another call may create it meanwhile: this insert then waits
        -- for it and does nothing, and the loop locks what it made.
        INSERT INTO {schema}.limits (name, keyed, key)
        VALUES (p_name, p_key IS NOT NULL, COALESCE(p_key, ''))
        ON CONFLICT (name, keyed, key) DO NOTHING
        RETURNING * INTO l;
        IF FOUND THEN
            RETURN l;
        END IF;
    END LOOP;
END $$;

-- Drops the pair's expired slots, lapsed waiters and stale bookings.
CREATE FUNCTION {schema}.limit_prune(p_id bigint, p_now timestamptz, p_grace_us bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.limit_holders WHERE limit_id = p_id AND expires_at <= p_now;
    DELETE FROM {schema}.limit_waiters WHERE limit_id = p_id AND deadline < p_now;
    DELETE FROM {schema}.limit_bookings
    WHERE limit_id = p_id AND due + {schema}.us(p_grace_us) <= p_now;
END $$;

-- Reserves free slots for the first waiters in line (each for its own
-- hold); their wakes, in line order.
CREATE FUNCTION {schema}.limit_promote(p_id bigint, p_concurrency integer, p_now timestamptz)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    w record;
    added boolean;
    wakes text[] := '{}';
BEGIN
    IF p_concurrency IS NULL THEN
        RETURN wakes;
    END IF;
    SELECT count(*) INTO held FROM {schema}.limit_holders WHERE limit_id = p_id;
    WHILE held < p_concurrency LOOP
        DELETE FROM {schema}.limit_waiters x
        WHERE x.limit_id = p_id AND x.arrival = (
            SELECT min(y.arrival) FROM {schema}.limit_waiters y WHERE y.limit_id = p_id)
        RETURNING x.waiter, x.hold_us, x.wake INTO w;
        EXIT WHEN NOT FOUND;
        INSERT INTO {schema}.limit_holders AS h (limit_id, holder, expires_at)
        VALUES (p_id, 'w:' || w.waiter, p_now + {schema}.us(w.hold_us))
        ON CONFLICT (limit_id, holder) DO UPDATE SET expires_at = excluded.expires_at
        RETURNING h.xmax = 0 INTO added;
        IF added THEN
            held := held + 1;
        END IF;
        wakes := wakes || w.wake;
    END LOOP;
    RETURN wakes;
END $$;

-- Deletes the pair if it holds nothing: no slot, no waiter, no booking,
-- and its rate's next token is not in the future.
CREATE FUNCTION {schema}.limit_forget_if_idle(p_id bigint, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.limits l
    WHERE l.id = p_id AND (l.tat IS NULL OR l.tat <= p_now)
      AND NOT EXISTS (SELECT 1 FROM {schema}.limit_holders h WHERE h.limit_id = p_id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.limit_waiters w WHERE w.limit_id = p_id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.limit_bookings b WHERE b.limit_id = p_id);
END $$;

-- Refused a slot: joins the line (or keeps its place, with a new deadline,
-- hold and wake) when it can be woken. `retry_us`: until the first held
-- slot expires (at least 1 ms); `ahead`: the waiters before it (the whole
-- line for one that does not queue).
CREATE FUNCTION {schema}.limit_queue(l {schema}.limits, p_waiter text, p_hold_us bigint,
    p_wake text, p_now timestamptz, OUT retry_us bigint, OUT ahead bigint)
LANGUAGE plpgsql AS $$
DECLARE
    first timestamptz;
    place bigint;
BEGIN
    SELECT min(expires_at) INTO first FROM {schema}.limit_holders WHERE limit_id = l.id;
    retry_us := greatest(COALESCE({schema}.us_until(first, p_now), 1000), 1000);
    IF p_wake IS NULL THEN
        SELECT count(*) INTO ahead FROM {schema}.limit_waiters WHERE limit_id = l.id;
        RETURN;
    END IF;
    UPDATE {schema}.limit_waiters
    SET deadline = p_now + {schema}.us(retry_us + p_hold_us), hold_us = p_hold_us, wake = p_wake
    WHERE limit_id = l.id AND waiter = p_waiter
    RETURNING arrival INTO place;
    IF NOT FOUND THEN
        UPDATE {schema}.limits SET arrivals = arrivals + 1 WHERE id = l.id
        RETURNING arrivals INTO place;
        INSERT INTO {schema}.limit_waiters (limit_id, waiter, arrival, deadline, hold_us, wake)
        VALUES (l.id, p_waiter, place, p_now + {schema}.us(retry_us + p_hold_us), p_hold_us, p_wake);
    END IF;
    SELECT count(*) INTO ahead FROM {schema}.limit_waiters
    WHERE limit_id = l.id AND arrival < place;
END $$;

-- The rate's decision for `p_waiter` (a token every `p_interval_us`,
-- `p_tolerance_us` of burst): NULL to start now (a token is spent), else
-- how long until it should come back. As `MemLimit::rate`: the bucket
-- (`tat`, GCRA) moves only when a start is granted, so waiters that come
-- back late cannot start in a bunch; bookings only order the waiters. A
-- newcomer books the next free time after the last booking; a waiter
-- whose booking is due starts if the bucket allows, else keeps it and is
-- told the bucket's next token plus an interval per booking ahead of it
-- still owed (due within `p_late_us`); a newcomer does not take the token
-- of a waiter owed it.
CREATE FUNCTION {schema}.limit_take_token(l {schema}.limits, p_waiter text,
    p_interval_us bigint, p_tolerance_us bigint, p_late_us bigint, p_now timestamptz)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    spacing interval := {schema}.us(p_interval_us);
    free_at timestamptz :=
        greatest(COALESCE(l.tat - {schema}.us(p_tolerance_us), p_now), p_now);
    owed_since timestamptz := p_now - {schema}.us(p_late_us);
    booked timestamptz;
    owed_ahead bigint;
    due timestamptz;
BEGIN
    SELECT b.due INTO booked FROM {schema}.limit_bookings b
    WHERE b.limit_id = l.id AND b.waiter = p_waiter;
    IF booked > p_now THEN
        RETURN {schema}.us_until(booked, p_now);
    ELSIF booked IS NOT NULL AND free_at > p_now THEN
        SELECT count(*) INTO owed_ahead FROM {schema}.limit_bookings b
        WHERE b.limit_id = l.id AND b.due < booked AND b.due <= p_now AND b.due > owed_since;
        RETURN {schema}.us_until(free_at, p_now) + p_interval_us * owed_ahead;
    ELSIF booked IS NULL AND (free_at > p_now OR EXISTS (
            SELECT 1 FROM {schema}.limit_bookings b
            WHERE b.limit_id = l.id AND b.due <= p_now AND b.due > owed_since)) THEN
        -- GREATEST ignores a NULL: with no booking, the bucket's next token.
        SELECT greatest(max(b.due) + spacing, free_at) INTO due FROM {schema}.limit_bookings b
        WHERE b.limit_id = l.id;
        IF due <= p_now THEN
            due := p_now + spacing;
        END IF;
        INSERT INTO {schema}.limit_bookings (limit_id, waiter, due) VALUES (l.id, p_waiter, due);
        RETURN {schema}.us_until(due, p_now);
    END IF;
    DELETE FROM {schema}.limit_bookings WHERE limit_id = l.id AND waiter = p_waiter;
    UPDATE {schema}.limits SET tat = greatest(COALESCE(l.tat, p_now), p_now) + spacing
    WHERE id = l.id;
    RETURN NULL;
END $$;

-- The decision on a request, the pair locked, pruned and promoted:
-- `decision` 0 granted, 1 wait for a slot, 2 wait for a token, with
-- `retry_us` and `ahead` for a wait.
CREATE FUNCTION {schema}.limit_decide(l {schema}.limits, p_concurrency integer,
    p_interval_us bigint, p_tolerance_us bigint, p_late_us bigint, p_holder text, p_waiter text,
    p_hold_us bigint, p_wake text, p_now timestamptz,
    OUT decision smallint, OUT retry_us bigint, OUT ahead bigint)
LANGUAGE plpgsql AS $$
DECLARE
    reserved boolean := false;
    held bigint;
BEGIN
    decision := 0; ahead := 0;
    IF p_concurrency IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM {schema}.limit_holders
                   WHERE limit_id = l.id AND holder = p_holder) THEN
            RETURN;
        END IF;
        reserved := EXISTS (SELECT 1 FROM {schema}.limit_holders
                            WHERE limit_id = l.id AND holder = 'w:' || p_waiter);
        IF NOT reserved THEN
            SELECT count(*) INTO held FROM {schema}.limit_holders WHERE limit_id = l.id;
            IF held >= p_concurrency THEN
                decision := 1;
                SELECT q.retry_us, q.ahead INTO retry_us, ahead
                FROM {schema}.limit_queue(l, p_waiter, p_hold_us, p_wake, p_now) q;
                RETURN;
            END IF;
        END IF;
    END IF;
    IF p_interval_us IS NOT NULL THEN
        -- Refused a token, a waiter keeps its reservation (it is not
        -- taken until the start).
        retry_us := {schema}.limit_take_token(l, p_waiter, p_interval_us, p_tolerance_us,
            p_late_us, p_now);
        IF retry_us IS NOT NULL THEN
            decision := 2;
            RETURN;
        END IF;
    END IF;
    IF p_concurrency IS NOT NULL THEN
        IF reserved THEN
            DELETE FROM {schema}.limit_holders WHERE limit_id = l.id AND holder = 'w:' || p_waiter;
        END IF;
        DELETE FROM {schema}.limit_waiters WHERE limit_id = l.id AND waiter = p_waiter;
        INSERT INTO {schema}.limit_holders (limit_id, holder, expires_at)
        VALUES (l.id, p_holder, p_now + {schema}.us(p_hold_us))
        ON CONFLICT (limit_id, holder) DO UPDATE SET expires_at = excluded.expires_at;
    END IF;
END $$;

-- `Limits::limit_acquire`: asks to start one attempt under the pair
-- (`p_key` NULL: the unkeyed limit). `p_concurrency` NULL: no slots;
-- `p_interval_us` NULL: no rate. Answers the decision (see
-- `limit_decide`) and the wakes of the waiters this call gave a slot to.
CREATE FUNCTION {schema}.limit_acquire(p_name text, p_key text, p_concurrency integer,
    p_interval_us bigint, p_tolerance_us bigint, p_holder text, p_waiter text, p_hold_us bigint,
    p_wake text, p_grace_us bigint, p_late_us bigint,
    OUT decision smallint, OUT retry_us bigint, OUT ahead bigint, OUT wakes text[])
LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
    at_now timestamptz;
BEGIN
    l := {schema}.limit_lock(p_name, p_key, true);
    at_now := clock_timestamp();
    PERFORM {schema}.limit_prune(l.id, at_now, p_grace_us);
    wakes := {schema}.limit_promote(l.id, p_concurrency, at_now);
    SELECT d.decision, d.retry_us, d.ahead INTO decision, retry_us, ahead
    FROM {schema}.limit_decide(l, p_concurrency, p_interval_us, p_tolerance_us, p_late_us,
        p_holder, p_waiter, p_hold_us, p_wake, at_now) d;
    PERFORM {schema}.limit_forget_if_idle(l.id, at_now);
END $$;

-- `Limits::limit_release`: frees `p_holder`'s slot (`released`: it held
-- one), and reserves freed slots for the first waiters in line.
CREATE FUNCTION {schema}.limit_release(p_name text, p_key text, p_holder text,
    p_concurrency integer, p_grace_us bigint, OUT released boolean, OUT wakes text[])
LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
    at_now timestamptz;
BEGIN
    released := false; wakes := '{}';
    l := {schema}.limit_lock(p_name, p_key, false);
    IF l.id IS NULL THEN
        RETURN;
    END IF;
    at_now := clock_timestamp();
    PERFORM {schema}.limit_prune(l.id, at_now, p_grace_us);
    DELETE FROM {schema}.limit_holders WHERE limit_id = l.id AND holder = p_holder;
    released := FOUND;
    wakes := {schema}.limit_promote(l.id, p_concurrency, at_now);
    PERFORM {schema}.limit_forget_if_idle(l.id, at_now);
END $$;

-- `Limits::limit_leave`: `p_waiter` stops waiting (its task was cancelled
-- or ended while parked): it leaves the line, the slot reserved for it is
-- freed and its booked token dropped (`released`: it had any of the
-- three), and freed slots are reserved for the next in line.
CREATE FUNCTION {schema}.limit_leave(p_name text, p_key text, p_waiter text,
    p_concurrency integer, p_grace_us bigint, OUT released boolean, OUT wakes text[])
LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
    at_now timestamptz;
BEGIN
    released := false; wakes := '{}';
    l := {schema}.limit_lock(p_name, p_key, false);
    IF l.id IS NULL THEN
        RETURN;
    END IF;
    at_now := clock_timestamp();
    PERFORM {schema}.limit_prune(l.id, at_now, p_grace_us);
    DELETE FROM {schema}.limit_waiters WHERE limit_id = l.id AND waiter = p_waiter;
    released := FOUND;
    DELETE FROM {schema}.limit_holders WHERE limit_id = l.id AND holder = 'w:' || p_waiter;
    released := released OR FOUND;
    DELETE FROM {schema}.limit_bookings WHERE limit_id = l.id AND waiter = p_waiter;
    released := released OR FOUND;
    wakes := {schema}.limit_promote(l.id, p_concurrency, at_now);
    PERFORM {schema}.limit_forget_if_idle(l.id, at_now);
END $$;

-- `Limits::limit_renew`: extends `p_holder`'s slot to `p_hold_us` from
-- now; false when it holds none.
CREATE FUNCTION {schema}.limit_renew(p_name text, p_key text, p_holder text, p_hold_us bigint,
    p_grace_us bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
    at_now timestamptz;
    renewed boolean;
BEGIN
    l := {schema}.limit_lock(p_name, p_key, false);
    IF l.id IS NULL THEN
        RETURN false;
    END IF;
    at_now := clock_timestamp();
    PERFORM {schema}.limit_prune(l.id, at_now, p_grace_us);
    UPDATE {schema}.limit_holders SET expires_at = at_now + {schema}.us(p_hold_us)
    WHERE limit_id = l.id AND holder = p_holder;
    renewed := FOUND;
    PERFORM {schema}.limit_forget_if_idle(l.id, at_now);
    RETURN renewed;
END $$;

-- `Limits::limit_usage`: the pair's slots held or reserved, waiters in
-- line and tokens booked, once the expired are dropped.
CREATE FUNCTION {schema}.limit_usage(p_name text, p_key text, p_grace_us bigint,
    OUT in_use bigint, OUT waiting bigint, OUT booked bigint)
LANGUAGE plpgsql AS $$
DECLARE
    l {schema}.limits;
    at_now timestamptz;
BEGIN
    in_use := 0; waiting := 0; booked := 0;
    l := {schema}.limit_lock(p_name, p_key, false);
    IF l.id IS NULL THEN
        RETURN;
    END IF;
    at_now := clock_timestamp();
    PERFORM {schema}.limit_prune(l.id, at_now, p_grace_us);
    SELECT count(*) INTO in_use FROM {schema}.limit_holders WHERE limit_id = l.id;
    SELECT count(*) INTO waiting FROM {schema}.limit_waiters WHERE limit_id = l.id;
    SELECT count(*) INTO booked FROM {schema}.limit_bookings WHERE limit_id = l.id;
    PERFORM {schema}.limit_forget_if_idle(l.id, at_now);
END $$;

-- Removes up to `p_batch` pairs that nobody called since everything they
-- held ran out (holders died, waiters went away, bookings went stale
-- `p_grace_us` after due), with their rows; pairs another call holds are
-- skipped. Returns how many.
CREATE FUNCTION {schema}.limits_sweep(p_batch integer, p_grace_us bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    at_now timestamptz := clock_timestamp();
    gone bigint[];
BEGIN
    SELECT COALESCE(array_agg(x.id), '{}') INTO gone FROM (
        SELECT l.id FROM {schema}.limits l
        WHERE (l.tat IS NULL OR l.tat <= at_now)
          AND NOT EXISTS (SELECT 1 FROM {schema}.limit_holders h
                          WHERE h.limit_id = l.id AND h.expires_at > at_now)
          AND NOT EXISTS (SELECT 1 FROM {schema}.limit_waiters w
                          WHERE w.limit_id = l.id AND w.deadline >= at_now)
          AND NOT EXISTS (SELECT 1 FROM {schema}.limit_bookings b
                          WHERE b.limit_id = l.id AND b.due + {schema}.us(p_grace_us) > at_now)
        ORDER BY l.id LIMIT p_batch
        FOR UPDATE SKIP LOCKED) AS x;
    DELETE FROM {schema}.limit_holders WHERE limit_id = ANY(gone);
    DELETE FROM {schema}.limit_waiters WHERE limit_id = ANY(gone);
    DELETE FROM {schema}.limit_bookings WHERE limit_id = ANY(gone);
    DELETE FROM {schema}.limits WHERE id = ANY(gone);
    RETURN cardinality(gone);
END $$;

-- A parked saga message: delayed (visible later than it was put or handed
-- back), not taken. Only delayed messages are in this index, so an
-- engine's ordinary writes (the next message, due at once) add nothing to
-- it.
CREATE INDEX queue_delayed_of_task ON {schema}.queue (task_id)
    WHERE kind = 0 AND claim IS NULL AND visible_at > enqueued_at;

-- `WorkQueue::wake`: makes the delayed saga message `p_payload` of task
-- `p_task` due now, once (a woken message is no longer delayed: a second
-- wake, even one waiting on the same row meanwhile, finds nothing).
-- Notifies nobody: the engine wakes readers after the commit (see `put`).
-- Returns whether it woke one.
CREATE FUNCTION {schema}.wake_delayed(p_task uuid, p_payload text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    at_now timestamptz := clock_timestamp();
    woken bigint;
BEGIN
    UPDATE {schema}.queue q SET visible_at = at_now, enqueued_at = at_now
    WHERE q.id = (
        SELECT p.id FROM {schema}.queue p
        WHERE p.task_id = p_task AND p.kind = 0 AND p.claim IS NULL
          AND p.visible_at > p.enqueued_at AND p.visible_at > at_now AND p.payload = p_payload
        ORDER BY p.id LIMIT 1
        FOR UPDATE)
    RETURNING q.id INTO woken;
    RETURN woken IS NOT NULL;
END $$;
