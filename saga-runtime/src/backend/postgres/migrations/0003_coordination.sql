-- Coordination between the engines of a deployment: named leases (one
-- timer poller, one janitor at a time), `scope = shared` circuit breakers,
-- and which engines run which process managers. `{schema}` is the
-- backend's schema (quoted when substituted).
--
-- The semantics are the in-memory backend's and the Redis scripts'
-- (named_lease.lua, unlock.lua, breaker_acquire.lua, breaker_report.lua,
-- announce.lua, runners.lua); every time that decides an expiry is the
-- server's (clock_timestamp()), never an engine's clock.
--
-- What stays bounded, and why:
-- - named_leases: a row per lease name (the engine uses two, `timers` and
--   `housekeeping`), taken over in place and deleted on release.
-- - breakers: a row per shared breaker (saga step) only while it counts
--   failures or is open; a success deletes it, and a row not reported on
--   for `keep` (a day past its break) is treated as gone and replaced.
-- - process_runners: a row per (process manager, engine) announced; an
--   engine's id is new each time it starts, so every announcement removes
--   the rows that expired (those of engines that died without leaving).
--   At most (engines alive within a TTL) x (process managers).

-- A named lease: held by `holder` until `expires_at`, then free.
CREATE TABLE {schema}.named_leases (
    name text PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Takes or renews the named lease `p_name` for `p_token`: free (no row, or
-- expired) or already held by this token. Returns whether the token holds
-- it now. One statement: the upsert locks the row, so of two engines
-- asking at once exactly one gets it.
CREATE FUNCTION {schema}.named_lease(p_name text, p_token text, p_ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.named_leases AS l (name, holder, expires_at)
    VALUES (p_name, p_token, clock_timestamp() + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (name) DO UPDATE
        SET holder = excluded.holder, expires_at = excluded.expires_at
        WHERE l.holder = excluded.holder OR l.expires_at <= clock_timestamp();
    RETURN FOUND;
END $$;

-- Releases the named lease `p_name` if `p_token` holds it (compare and
-- delete). Returns whether it did.
CREATE FUNCTION {schema}.release_named_lease(p_name text, p_token text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.named_leases WHERE name = p_name AND holder = p_token;
    RETURN FOUND;
END $$;

-- A shared circuit breaker while it is not plainly closed: counting
-- `failures` (closed), open until `open_until`, or half-open with a probe
-- out until `probe_until` under `probe_token`. No row: closed, nothing
-- counted. A row past `keep_until` is as good as no row (Redis lets the
-- key expire).
CREATE TABLE {schema}.breakers (
    name text PRIMARY KEY,
    failures integer NOT NULL DEFAULT 0,
    open_until timestamptz,
    probe_until timestamptz,
    probe_token text,
    keep_until timestamptz NOT NULL
);

-- Milliseconds from `p_now` until `p_until`, rounded up (at least 1): a
-- caller told to come back after it must not come back before.
CREATE FUNCTION {schema}.ms_until(p_until timestamptz, p_now timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(ceil(extract(epoch FROM (p_until - p_now)) * 1000)::bigint, 1);
$$;

-- A shared breaker's decision before a call: `admitted` (with `probe` when it
-- is the one half-open probe, its slot held for `p_probe_ttl_ms` under
-- `p_token`; `counting` while failures are being counted), or not before
-- `retry_after_ms`. Only a caller that finds the probe's slot free locks
-- the row: the healthy path of every call through a breaker, and the
-- callers told to wait during a break, do not queue on one row.
CREATE FUNCTION {schema}.breaker_acquire(p_name text, p_probe_ttl_ms bigint, p_token text,
    OUT admitted boolean, OUT probe boolean, OUT counting boolean, OUT retry_after_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
    at_now timestamptz := clock_timestamp();
    locked boolean := false;
BEGIN
    admitted := true; probe := false; counting := false;
    LOOP
        IF locked THEN
            SELECT failures, open_until, probe_until INTO b FROM {schema}.breakers
            WHERE name = p_name AND keep_until > at_now FOR UPDATE;
            at_now := clock_timestamp();
        ELSE
            SELECT failures, open_until, probe_until INTO b FROM {schema}.breakers
            WHERE name = p_name AND keep_until > at_now;
        END IF;
        IF NOT FOUND THEN
            RETURN;
        ELSIF b.open_until IS NULL THEN
            counting := b.failures > 0;
            RETURN;
        ELSIF at_now < b.open_until THEN
            admitted := false; retry_after_ms := {schema}.ms_until(b.open_until, at_now);
            RETURN;
        ELSIF b.probe_until IS NOT NULL AND at_now < b.probe_until THEN
            admitted := false; retry_after_ms := {schema}.ms_until(b.probe_until, at_now);
            RETURN;
        ELSIF locked THEN
            UPDATE {schema}.breakers
            SET probe_until = at_now + p_probe_ttl_ms * interval '1 millisecond', probe_token = p_token
            WHERE name = p_name;
            probe := true;
            RETURN;
        END IF;
        -- The slot looks free: decide again on the row to itself (another
        -- caller may have taken the slot, or the breaker closed, meanwhile).
        locked := true;
    END LOOP;
END $$;

-- Records a call's outcome on a shared breaker (see
-- `Breakers::breaker_report`): `p_probe` the probe's token (NULL: not a
-- probe), `p_failed` NULL when the call did not happen. A probe whose slot
-- has since gone to another is ignored. Returns 1 if this report opened
-- the breaker, 2 if it closed it, else 0.
CREATE FUNCTION {schema}.breaker_report(p_name text, p_probe text, p_failed boolean,
    p_threshold integer, p_open_ms bigint, p_keep_ms bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    b record;
    at_now timestamptz := clock_timestamp();
    keep timestamptz := clock_timestamp() + p_keep_ms * interval '1 millisecond';
    opened timestamptz := clock_timestamp() + p_open_ms * interval '1 millisecond';
    n integer;
BEGIN
    -- Kept past its time without a report: forgotten, as if expired.
    DELETE FROM {schema}.breakers WHERE name = p_name AND keep_until <= at_now;
    SELECT probe_until, probe_token, open_until INTO b FROM {schema}.breakers
    WHERE name = p_name FOR UPDATE;
    IF p_probe IS NOT NULL
       AND (NOT FOUND OR b.probe_until IS NULL OR b.probe_token IS DISTINCT FROM p_probe) THEN
        RETURN 0;
    END IF;
    IF p_failed IS NULL THEN
        -- The call did not happen: a probe's slot goes to the next caller.
        IF p_probe IS NOT NULL THEN
            UPDATE {schema}.breakers SET probe_until = NULL WHERE name = p_name;
        END IF;
        RETURN 0;
    ELSIF NOT p_failed THEN
        -- A success closes a probed breaker and resets a count: no row is
        -- a closed breaker that counts nothing.
        IF p_probe IS NOT NULL THEN
            DELETE FROM {schema}.breakers WHERE name = p_name;
            RETURN 2;
        END IF;
        DELETE FROM {schema}.breakers WHERE name = p_name AND open_until IS NULL;
        RETURN 0;
    ELSIF p_probe IS NOT NULL THEN
        UPDATE {schema}.breakers
        SET open_until = opened, probe_until = NULL, probe_token = NULL, failures = 0,
            keep_until = keep
        WHERE name = p_name;
        RETURN 1;
    END IF;
    -- A failure of a call admitted while closed. One admitted before the
    -- breaker opened (it is open now) changes nothing. The upsert settles
    -- two first failures reported at once.
    INSERT INTO {schema}.breakers AS r (name, failures, keep_until) VALUES (p_name, 1, keep)
    ON CONFLICT (name) DO UPDATE SET failures = r.failures + 1, keep_until = excluded.keep_until
        WHERE r.open_until IS NULL
    RETURNING r.failures INTO n;
    IF NOT FOUND OR n < p_threshold THEN
        RETURN 0;
    END IF;
    UPDATE {schema}.breakers SET open_until = opened, failures = 0, keep_until = keep
    WHERE name = p_name;
    RETURN 1;
END $$;

-- Which engines run which process managers, each until `expires_at`: an
-- engine handed a message for a process manager it does not run hands it
-- back at once when another engine runs it. One row per engine, so that
-- one engine's short announcement (or its leaving) cuts no other's. No
-- index on the expiry: the table holds a few rows per engine, and every
-- renewal (each engine's heartbeat) stays a heap-only update.
CREATE TABLE {schema}.process_runners (
    process text NOT NULL,
    member text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (process, member)
);

-- Records that `p_member` runs the process managers `p_names` for
-- `p_ttl_ms` (NULL: it stops running them now), and removes the rows of
-- engines whose announcements expired (skipping those another call is
-- removing or renewing: nobody waits on them).
CREATE FUNCTION {schema}.announce_processes(p_member text, p_names text[], p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    runs_until timestamptz := clock_timestamp() + p_ttl_ms * interval '1 millisecond';
BEGIN
    DELETE FROM {schema}.process_runners WHERE (process, member) IN (
        SELECT process, member FROM {schema}.process_runners
        WHERE expires_at <= clock_timestamp()
        FOR UPDATE SKIP LOCKED);
    IF p_ttl_ms IS NULL THEN
        DELETE FROM {schema}.process_runners WHERE member = p_member AND process = ANY(p_names);
    ELSE
        INSERT INTO {schema}.process_runners (process, member, expires_at)
        SELECT DISTINCT n, p_member, runs_until FROM unnest(p_names) AS n
        ORDER BY n
        ON CONFLICT (process, member) DO UPDATE SET expires_at = excluded.expires_at;
    END IF;
END $$;
