-- Process managers: instances with their correlation entries and
-- tombstones, scheduled timeouts, tallies, endpoints. `{schema}` is the
-- backend's schema (quoted when substituted).
--
-- As in the core, every write of the protocol is one function call (one
-- statement, one transaction) that checks before it writes and answers a
-- code: 0 written, -2 conflict (a version, a generation, or a correlation
-- entry owned by another instance), -6 a tombstone remembers a message
-- the write handles, -7 a tally it opens exists (detail: which, from 1).
-- Times that decide expiries and idleness are the server's.

-- An instance: its record (state, status, keys, processed ids, audit log)
-- as one document, as the engine reads and writes it whole; the version
-- and generation the writes compare are columns.
CREATE TABLE {schema}.process_instances (
    process text NOT NULL,
    id text NOT NULL,
    generation text NOT NULL,
    version bigint NOT NULL,
    created_ms bigint NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (process, id)
);
CREATE INDEX process_instances_by_age ON {schema}.process_instances (process, created_ms, id);

-- Correlation entries: a value of a field belongs to one instance (the
-- primary key is what makes a second owner impossible).
CREATE TABLE {schema}.process_entries (
    process text NOT NULL,
    field text NOT NULL,
    value text NOT NULL,
    instance text NOT NULL,
    PRIMARY KEY (process, field, value)
);
CREATE INDEX process_entries_of ON {schema}.process_entries (process, instance);

-- Shared correlation entries (`#[handles(many)]`): a set of instances per
-- value.
CREATE TABLE {schema}.process_shared_entries (
    process text NOT NULL,
    field text NOT NULL,
    value text NOT NULL,
    instance text NOT NULL,
    PRIMARY KEY (process, field, value, instance)
);
CREATE INDEX process_shared_entries_of ON {schema}.process_shared_entries (process, instance);

-- What deleted instances handled, until it expires: under the instance's
-- id (kind 0, field '') and under each correlation entry it released
-- (kind 1). A write that handles one of these messages there is a late
-- duplicate.
CREATE TABLE {schema}.process_tombstones (
    process text NOT NULL,
    kind smallint NOT NULL,
    field text NOT NULL,
    value text NOT NULL,
    message_id text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (process, kind, field, value, message_id)
);
CREATE INDEX process_tombstones_expiring ON {schema}.process_tombstones (expires_at);

-- Scheduled timeouts, by due time (wall-clock ms, as the engine asks).
CREATE TABLE {schema}.process_timers (
    id bigserial PRIMARY KEY,
    due_ms bigint NOT NULL,
    payload text NOT NULL
);
CREATE INDEX process_timers_due ON {schema}.process_timers (due_ms, id);

-- Tallies: a head row that counts what is left (the check that takes it
-- to 0 is the one that sends the completion: the row's lock orders the
-- checks), and a row per item.
CREATE TABLE {schema}.tallies (
    id bigserial PRIMARY KEY,
    process text NOT NULL,
    instance text NOT NULL,
    generation text NOT NULL,
    name text NOT NULL,
    total integer NOT NULL,
    remaining integer NOT NULL,
    late boolean NOT NULL DEFAULT false,
    completion text NOT NULL,
    completion_late text NOT NULL,
    expires_at timestamptz NOT NULL,
    UNIQUE (process, instance, generation, name)
);
CREATE INDEX tallies_expiring ON {schema}.tallies (expires_at);

-- `checked` is no index's column, so a check's update stays on its page
-- (a heap-only tuple).
CREATE TABLE {schema}.tally_items (
    tally bigint NOT NULL,
    item text NOT NULL,
    checked boolean NOT NULL DEFAULT false,
    PRIMARY KEY (tally, item)
);

-- Endpoints. A message's `seq` comes from its endpoint's row, taken under
-- that row's lock until the writing transaction commits: an endpoint's
-- messages become visible in `seq` order, so a group's position (the last
-- `seq` it was given) never passes one that commits later. (A sequence
-- would not do: its numbers commit out of order.)
CREATE TABLE {schema}.endpoints (
    name text PRIMARY KEY,
    last_seq bigint NOT NULL
);

CREATE TABLE {schema}.endpoint_messages (
    endpoint text NOT NULL,
    seq bigint NOT NULL,
    envelope text NOT NULL,
    PRIMARY KEY (endpoint, seq)
);

-- A consumer group: the last message it was given...
CREATE TABLE {schema}.endpoint_groups (
    endpoint text NOT NULL,
    name text NOT NULL,
    last_seq bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, name)
);

-- ... and those given but not settled: to whom, how often, since when.
-- Consumers are not registered otherwise: what one holds is here, under
-- its name.
CREATE TABLE {schema}.endpoint_pending (
    endpoint text NOT NULL,
    grp text NOT NULL,
    seq bigint NOT NULL,
    consumer text NOT NULL,
    deliveries integer NOT NULL,
    since timestamptz NOT NULL,
    PRIMARY KEY (endpoint, grp, seq)
);

CREATE TABLE {schema}.endpoint_dead_letters (
    id bigserial PRIMARY KEY,
    endpoint text NOT NULL,
    payload text NOT NULL,
    reason text NOT NULL,
    at_ms bigint NOT NULL,
    size bigint
);
CREATE INDEX endpoint_dead_letters_of ON {schema}.endpoint_dead_letters (endpoint, id);

-- Serializes the writes of an instance and of the correlation entries
-- they claim or release (`p_entries`: `[[field, value], ..]`), taken in
-- one order so that two writes never wait for each other in a circle:
-- what a write checks stays true until it commits, including that an
-- instance or an entry does not exist yet. (Two keys that hash alike only
-- wait for each other.)
CREATE FUNCTION {schema}.process_lock(p_process text, p_id text, p_entries jsonb)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k bigint;
BEGIN
    FOR k IN
        SELECT DISTINCT h FROM (
            SELECT hashtextextended('{schema}|instance|' || p_process || '|' || p_id, 0) AS h
            UNION ALL
            SELECT hashtextextended('{schema}|entry|' || p_process || '|' || (e->>0) || '|' || (e->>1), 0)
            FROM jsonb_array_elements(p_entries) AS e
        ) AS keys
        ORDER BY h
    LOOP
        PERFORM pg_advisory_xact_lock(k);
    END LOOP;
END $$;

-- Why a write of instance `p_id` must be refused, if it must (in the
-- order the memory backend checks): another version or generation stored,
-- a tally it opens exists, a message it handles is remembered by a
-- tombstone of the instance or of an entry it claims, an entry it claims
-- is another instance's. `code` 0 when none.
CREATE FUNCTION {schema}.process_refusal(p_process text, p_id text, p_generation text,
    p_version bigint, p_delete boolean, p_handled text[], p_add jsonb, p_tallies jsonb,
    OUT code integer, OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    stored record;
    which bigint;
BEGIN
    code := 0;
    SELECT i.version, i.generation INTO stored FROM {schema}.process_instances i
    WHERE i.process = p_process AND i.id = p_id;
    IF COALESCE(stored.version, 0) <> p_version
       OR (stored.generation IS NOT NULL AND stored.generation <> '' AND p_generation <> ''
           AND stored.generation <> p_generation) THEN
        code := -2; detail := COALESCE(stored.version, 0)::text;
        RETURN;
    END IF;
    SELECT o.n INTO which
    FROM jsonb_array_elements(p_tallies) WITH ORDINALITY AS o(t, n)
    WHERE EXISTS (SELECT 1 FROM {schema}.tallies t
                  WHERE t.process = o.t->>'process' AND t.instance = o.t->>'instance'
                    AND t.generation = o.t->>'generation' AND t.name = o.t->>'name'
                    AND t.expires_at > clock_timestamp())
    ORDER BY o.n LIMIT 1;
    IF which IS NOT NULL THEN
        code := -7; detail := which::text;
        RETURN;
    END IF;
    IF NOT p_delete AND cardinality(p_handled) > 0 AND EXISTS (
        SELECT 1 FROM {schema}.process_tombstones t
        WHERE t.process = p_process AND t.message_id = ANY(p_handled)
          AND t.expires_at > clock_timestamp()
          AND ((t.kind = 0 AND t.field = '' AND t.value = p_id)
               OR (t.kind = 1 AND (t.field, t.value) IN (
                   SELECT e->>0, e->>1 FROM jsonb_array_elements(p_add) AS e)))) THEN
        code := -6;
        RETURN;
    END IF;
    IF EXISTS (
        SELECT 1 FROM {schema}.process_entries c
        JOIN jsonb_array_elements(p_add) AS e ON c.field = e->>0 AND c.value = e->>1
        WHERE c.process = p_process AND c.instance <> p_id) THEN
        code := -2; detail := COALESCE(stored.version, 0)::text;
    END IF;
END $$;

-- Deletes instance `p_id` with every entry it owns, and leaves tombstones
-- under its id and the entries it releases (`p_released`) that remember
-- `p_handled` for `p_ttl_ms` (a place's earlier ids too: its expiry is
-- the latest deletion's, as a Redis set's).
CREATE FUNCTION {schema}.process_delete(p_process text, p_id text, p_released jsonb,
    p_handled text[], p_ttl_ms bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    expiry timestamptz := clock_timestamp() + p_ttl_ms * interval '1 millisecond';
BEGIN
    DELETE FROM {schema}.process_instances WHERE process = p_process AND id = p_id;
    DELETE FROM {schema}.process_entries WHERE process = p_process AND instance = p_id;
    DELETE FROM {schema}.process_shared_entries WHERE process = p_process AND instance = p_id;
    UPDATE {schema}.process_tombstones t SET expires_at = expiry
    FROM (SELECT 0::smallint AS kind, ''::text AS field, p_id AS value
          UNION SELECT 1, e->>0, e->>1 FROM jsonb_array_elements(p_released) AS e) AS p
    WHERE t.process = p_process AND t.kind = p.kind AND t.field = p.field AND t.value = p.value;
    INSERT INTO {schema}.process_tombstones (process, kind, field, value, message_id, expires_at)
    SELECT p_process, p.kind, p.field, p.value, m, expiry
    FROM (SELECT 0::smallint AS kind, ''::text AS field, p_id AS value
          UNION SELECT 1, e->>0, e->>1 FROM jsonb_array_elements(p_released) AS e) AS p,
         unnest(p_handled) AS m
    ON CONFLICT (process, kind, field, value, message_id) DO UPDATE SET expires_at = excluded.expires_at;
END $$;

-- Writes instance `p_id` under the next version with the entries it
-- claims and the shared entries it joins or leaves (`p_keys`: `add`,
-- `join`, `leave`, each `[[field, value], ..]`). Returns the version.
CREATE FUNCTION {schema}.process_save(p_process text, p_id text, p_generation text,
    p_version bigint, p_record jsonb, p_created_ms bigint, p_keys jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.process_entries (process, field, value, instance)
    SELECT p_process, e->>0, e->>1, p_id FROM jsonb_array_elements(p_keys->'add') AS e
    ON CONFLICT (process, field, value) DO NOTHING;
    INSERT INTO {schema}.process_shared_entries (process, field, value, instance)
    SELECT p_process, e->>0, e->>1, p_id FROM jsonb_array_elements(p_keys->'join') AS e
    ON CONFLICT DO NOTHING;
    DELETE FROM {schema}.process_shared_entries s
    USING jsonb_array_elements(p_keys->'leave') AS e
    WHERE s.process = p_process AND s.field = e->>0 AND s.value = e->>1 AND s.instance = p_id;
    INSERT INTO {schema}.process_instances (process, id, generation, version, created_ms, record)
    VALUES (p_process, p_id, p_generation, p_version + 1, p_created_ms, p_record)
    ON CONFLICT (process, id) DO UPDATE
    SET generation = excluded.generation, version = excluded.version, record = excluded.record;
    RETURN p_version + 1;
END $$;

-- Opens tallies (`[{process, instance, generation, name, items, keep_ms,
-- completion, completion_late}, ..]`): an expired one of the same name
-- goes first; one without items completes at once. One that exists is
-- left as it is (a write of an instance has refused it before).
CREATE FUNCTION {schema}.tally_open(p_tallies jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    o jsonb;
    tally_id bigint;
    n integer;
BEGIN
    FOR o IN SELECT t FROM jsonb_array_elements(p_tallies) AS t LOOP
        DELETE FROM {schema}.tally_items WHERE tally IN (
            SELECT t.id FROM {schema}.tallies t
            WHERE t.process = o->>'process' AND t.instance = o->>'instance'
              AND t.generation = o->>'generation' AND t.name = o->>'name'
              AND t.expires_at <= clock_timestamp());
        DELETE FROM {schema}.tallies t
        WHERE t.process = o->>'process' AND t.instance = o->>'instance'
          AND t.generation = o->>'generation' AND t.name = o->>'name'
          AND t.expires_at <= clock_timestamp();
        SELECT count(DISTINCT i) INTO n FROM jsonb_array_elements_text(o->'items') AS i;
        INSERT INTO {schema}.tallies (process, instance, generation, name, total, remaining,
            completion, completion_late, expires_at)
        VALUES (o->>'process', o->>'instance', o->>'generation', o->>'name', n, n,
            o->>'completion', o->>'completion_late',
            clock_timestamp() + (o->>'keep_ms')::bigint * interval '1 millisecond')
        ON CONFLICT (process, instance, generation, name) DO NOTHING
        RETURNING id INTO tally_id;
        CONTINUE WHEN tally_id IS NULL;
        INSERT INTO {schema}.tally_items (tally, item)
        SELECT DISTINCT tally_id, i FROM jsonb_array_elements_text(o->'items') AS i;
        IF n = 0 THEN
            PERFORM {schema}.put(1::smallint, o->>'completion', 0, 0);
        END IF;
    END LOOP;
END $$;

-- Appends messages to endpoints (`p_endpoints[i]` gets `p_envelopes[i]`,
-- in order), each endpoint keeping its newest `p_cap`. (The engine wakes
-- their readers after the commit: see `put`.) Endpoints' rows are locked in name order (two writes never
-- wait for each other in a circle).
CREATE FUNCTION {schema}.endpoint_append(p_endpoints text[], p_envelopes text[], p_cap bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e text;
    n bigint;
    top bigint;
BEGIN
    FOR e, n IN
        SELECT x.name, count(*) FROM unnest(p_endpoints) AS x(name) GROUP BY x.name ORDER BY x.name
    LOOP
        INSERT INTO {schema}.endpoints AS p (name, last_seq) VALUES (e, n)
        ON CONFLICT (name) DO UPDATE SET last_seq = p.last_seq + n
        RETURNING p.last_seq INTO top;
        INSERT INTO {schema}.endpoint_messages (endpoint, seq, envelope)
        SELECT e, top - n + row_number() OVER (ORDER BY m.i), m.envelope
        FROM unnest(p_endpoints, p_envelopes) WITH ORDINALITY AS m(name, envelope, i)
        WHERE m.name = e;
        IF top > p_cap THEN
            DELETE FROM {schema}.endpoint_pending WHERE endpoint = e AND seq <= top - p_cap;
            DELETE FROM {schema}.endpoint_messages WHERE endpoint = e AND seq <= top - p_cap;
        END IF;
    END LOOP;
END $$;

-- The atomic write of the process-manager protocol: the instance
-- (created, updated or deleted with its tombstones; `p_id` NULL: none),
-- its correlation entries (`p_keys`: `add`, `remove`, `join`, `leave`),
-- the messages its handler enqueued, scheduled and sent to endpoints, the
-- tallies it opened, and the settling of the message it handled and of
-- those batched with it (`p_batched_rows`/`_claims`: their deliveries).
-- Every check comes before the first write; a refusal writes nothing.
-- Notifies nobody: the engine wakes readers after the commit (see `put`).
CREATE FUNCTION {schema}.process_commit(
    p_process text, p_id text, p_generation text, p_version bigint, p_record jsonb,
    p_created_ms bigint, p_delete boolean, p_handled text[], p_deleted_handled text[],
    p_tombstone_ms bigint, p_keys jsonb, p_enqueue text[], p_due bigint[], p_timers text[],
    p_endpoints text[], p_envelopes text[], p_endpoint_cap bigint, p_tallies jsonb,
    p_settle text, p_queue_id bigint, p_delivery uuid, p_payload text, p_reason text,
    p_size bigint, p_dead_letter bigint, p_batched_rows bigint[], p_batched_claims uuid[],
    OUT code integer, OUT detail text, OUT version bigint)
LANGUAGE plpgsql AS $$
BEGIN
    code := 0;
    version := 0;
    IF p_id IS NOT NULL THEN
        PERFORM {schema}.process_lock(p_process, p_id, (p_keys->'add') || (p_keys->'remove'));
        SELECT r.code, r.detail INTO code, detail
        FROM {schema}.process_refusal(p_process, p_id, p_generation, p_version, p_delete,
            p_handled, p_keys->'add', p_tallies) AS r;
        IF code <> 0 THEN
            RETURN;
        END IF;
        DELETE FROM {schema}.process_entries c
        USING jsonb_array_elements(p_keys->'remove') AS e
        WHERE c.process = p_process AND c.field = e->>0 AND c.value = e->>1 AND c.instance = p_id;
        IF p_delete THEN
            PERFORM {schema}.process_delete(p_process, p_id, p_keys->'remove', p_deleted_handled,
                p_tombstone_ms);
        ELSE
            version := {schema}.process_save(p_process, p_id, p_generation, p_version, p_record,
                p_created_ms, p_keys);
        END IF;
    END IF;
    PERFORM {schema}.put(1::smallint, e, 0, 0) FROM unnest(p_enqueue) AS e;
    IF cardinality(p_due) > 0 THEN
        INSERT INTO {schema}.process_timers (due_ms, payload)
        SELECT d, t FROM unnest(p_due, p_timers) AS s(d, t);
    END IF;
    PERFORM {schema}.tally_open(p_tallies);
    PERFORM {schema}.settle(p_settle, p_queue_id, p_delivery, p_payload, p_reason, p_size,
        NULL, p_dead_letter);
    DELETE FROM {schema}.queue q
    USING unnest(p_batched_rows, p_batched_claims) AS b(id, claim)
    WHERE q.id = b.id AND q.claim = b.claim;
    -- Last: an endpoint's row stays locked until the commit.
    IF cardinality(p_endpoints) > 0 THEN
        PERFORM {schema}.endpoint_append(p_endpoints, p_envelopes, p_endpoint_cap);
    END IF;
END $$;

-- Moves up to `p_limit` timeouts due at `p_now_ms` onto the queue, each
-- once however many pollers race (`SKIP LOCKED`, then deleted); answers
-- how many moved and the earliest due time left (what the poller may
-- sleep until, notifications aside).
CREATE FUNCTION {schema}.release_timers(p_now_ms bigint, p_limit integer,
    OUT moved integer, OUT next_due bigint)
LANGUAGE plpgsql AS $$
BEGIN
    WITH due AS (
        DELETE FROM {schema}.process_timers WHERE id IN (
            SELECT t.id FROM {schema}.process_timers t WHERE t.due_ms <= p_now_ms
            ORDER BY t.due_ms, t.id LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING id, due_ms, payload)
    SELECT count({schema}.put(1::smallint, d.payload, 0, 0)) INTO moved
    FROM (SELECT * FROM due ORDER BY due_ms, id) AS d;
    SELECT min(t.due_ms) INTO next_due FROM {schema}.process_timers t;
END $$;

-- Checks `p_item` off a tally. `code`: 0 no such tally (or expired), 1
-- counted (`remaining` left), 2 completed by this check (which enqueued
-- the completion, the late one after the deadline mark), 3 checked
-- before, 4 no such item. Two checks of one item: the second waits for
-- the first's row and finds it checked; two last items: the head row
-- orders them, and one of them takes `remaining` to 0.
CREATE FUNCTION {schema}.tally_check(p_process text, p_instance text, p_generation text,
    p_name text, p_item text, p_completed_keep_ms bigint,
    OUT code integer, OUT remaining integer, OUT late boolean)
LANGUAGE plpgsql AS $$
DECLARE
    tally_id bigint;
BEGIN
    SELECT t.id INTO tally_id FROM {schema}.tallies t
    WHERE t.process = p_process AND t.instance = p_instance AND t.generation = p_generation
      AND t.name = p_name AND t.expires_at > clock_timestamp();
    IF tally_id IS NULL THEN
        code := 0;
        RETURN;
    END IF;
    UPDATE {schema}.tally_items i SET checked = true
    WHERE i.tally = tally_id AND i.item = p_item AND NOT i.checked;
    IF NOT FOUND THEN
        code := CASE WHEN EXISTS (SELECT 1 FROM {schema}.tally_items i
                                  WHERE i.tally = tally_id AND i.item = p_item)
                     THEN 3 ELSE 4 END;
        RETURN;
    END IF;
    UPDATE {schema}.tallies t
    SET remaining = t.remaining - 1,
        expires_at = CASE WHEN t.remaining = 1
                          THEN least(t.expires_at, clock_timestamp() + p_completed_keep_ms * interval '1 millisecond')
                          ELSE t.expires_at END
    WHERE t.id = tally_id
    RETURNING t.remaining, t.late INTO remaining, late;
    IF remaining > 0 THEN
        code := 1;
        RETURN;
    END IF;
    PERFORM {schema}.put(1::smallint,
        (SELECT CASE WHEN t.late THEN t.completion_late ELSE t.completion END
         FROM {schema}.tallies t WHERE t.id = tally_id), 0, 0);
    code := 2;
END $$;

-- A tally's progress with at most `p_missing` unchecked items (sorted);
-- `p_mark` records first that its deadline passed, unless it is complete.
-- `exists_` false: no such tally (or expired).
CREATE FUNCTION {schema}.tally_progress(p_process text, p_instance text, p_generation text,
    p_name text, p_missing integer, p_mark boolean,
    OUT exists_ boolean, OUT total integer, OUT remaining integer, OUT late boolean,
    OUT missing text[])
LANGUAGE plpgsql AS $$
DECLARE
    tally_id bigint;
BEGIN
    IF p_mark THEN
        UPDATE {schema}.tallies t SET late = true
        WHERE t.process = p_process AND t.instance = p_instance AND t.generation = p_generation
          AND t.name = p_name AND t.expires_at > clock_timestamp() AND t.remaining > 0
          AND NOT t.late;
    END IF;
    SELECT t.id, t.total, t.remaining, t.late INTO tally_id, total, remaining, late
    FROM {schema}.tallies t
    WHERE t.process = p_process AND t.instance = p_instance AND t.generation = p_generation
      AND t.name = p_name AND t.expires_at > clock_timestamp();
    exists_ := tally_id IS NOT NULL;
    IF NOT exists_ THEN
        RETURN;
    END IF;
    missing := ARRAY(SELECT i.item FROM {schema}.tally_items i
                     WHERE i.tally = tally_id AND NOT i.checked
                     ORDER BY i.item LIMIT greatest(p_missing, 0));
END $$;

-- The next message of an endpoint for `p_consumer` of group `p_group`: one
-- held unsettled for `p_idle_ms` by anyone first (its delivery count goes
-- up), else the group's next (a group that does not exist is created at
-- the oldest message kept). Nothing: `seq` NULL, and `wake_ms` says when
-- a held message becomes idle enough to take over (NULL: none held).
CREATE FUNCTION {schema}.endpoint_take(p_endpoint text, p_group text, p_consumer text,
    p_idle_ms bigint, OUT seq bigint, OUT envelope text, OUT deliveries integer,
    OUT wake_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    idle interval := p_idle_ms * interval '1 millisecond';
    given bigint;
BEGIN
    UPDATE {schema}.endpoint_pending p
    SET consumer = p_consumer, deliveries = p.deliveries + 1, since = clock_timestamp()
    FROM (SELECT q.seq FROM {schema}.endpoint_pending q
          WHERE q.endpoint = p_endpoint AND q.grp = p_group AND q.since <= clock_timestamp() - idle
          ORDER BY q.seq LIMIT 1 FOR UPDATE SKIP LOCKED) AS stale
    WHERE p.endpoint = p_endpoint AND p.grp = p_group AND p.seq = stale.seq
    RETURNING p.seq, p.deliveries INTO seq, deliveries;
    IF seq IS NULL THEN
        SELECT g.last_seq INTO given FROM {schema}.endpoint_groups g
        WHERE g.endpoint = p_endpoint AND g.name = p_group;
        -- Idle readers look without locking anything.
        IF given IS NULL OR EXISTS (SELECT 1 FROM {schema}.endpoint_messages m
                                   WHERE m.endpoint = p_endpoint AND m.seq > given) THEN
            INSERT INTO {schema}.endpoint_groups (endpoint, name) VALUES (p_endpoint, p_group)
            ON CONFLICT DO NOTHING;
            SELECT g.last_seq INTO given FROM {schema}.endpoint_groups g
            WHERE g.endpoint = p_endpoint AND g.name = p_group FOR UPDATE;
            SELECT min(m.seq) INTO seq FROM {schema}.endpoint_messages m
            WHERE m.endpoint = p_endpoint AND m.seq > given;
            IF seq IS NOT NULL THEN
                UPDATE {schema}.endpoint_groups g SET last_seq = seq
                WHERE g.endpoint = p_endpoint AND g.name = p_group;
                INSERT INTO {schema}.endpoint_pending (endpoint, grp, seq, consumer, deliveries, since)
                VALUES (p_endpoint, p_group, seq, p_consumer, 1, clock_timestamp());
                deliveries := 1;
            END IF;
        END IF;
    END IF;
    IF seq IS NULL THEN
        SELECT greatest(ceil(extract(epoch FROM min(p.since) + idle - clock_timestamp()) * 1000), 0)::bigint
        INTO wake_ms FROM {schema}.endpoint_pending p
        WHERE p.endpoint = p_endpoint AND p.grp = p_group;
        RETURN;
    END IF;
    SELECT m.envelope INTO envelope FROM {schema}.endpoint_messages m
    WHERE m.endpoint = p_endpoint AND m.seq = endpoint_take.seq;
END $$;

-- Settles a delivery of an endpoint's message: no longer pending for the
-- group; with `p_park`, kept as a dead letter of the endpoint (the newest
-- `p_dead_cap` are kept).
CREATE FUNCTION {schema}.endpoint_settle(p_endpoint text, p_group text, p_seq bigint,
    p_park boolean, p_payload text, p_reason text, p_size bigint, p_dead_cap bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.endpoint_pending p
    WHERE p.endpoint = p_endpoint AND p.grp = p_group AND p.seq = p_seq;
    IF p_park THEN
        INSERT INTO {schema}.endpoint_dead_letters (endpoint, payload, reason, at_ms, size)
        VALUES (p_endpoint, p_payload, p_reason,
                (extract(epoch FROM clock_timestamp()) * 1000)::bigint, p_size);
        DELETE FROM {schema}.endpoint_dead_letters d
        WHERE d.endpoint = p_endpoint AND d.id <= (
            SELECT x.id FROM {schema}.endpoint_dead_letters x WHERE x.endpoint = p_endpoint
            ORDER BY x.id DESC OFFSET p_dead_cap LIMIT 1);
    END IF;
END $$;

-- Removes an endpoint's messages every group has settled: those before
-- the oldest any group still needs (its oldest unsettled one, else the
-- one after the last it was given). Nothing goes while it has no group.
-- Returns how many went.
CREATE FUNCTION {schema}.endpoint_trim(p_endpoint text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    floor_seq bigint;
    gone integer := 0;
BEGIN
    SELECT min(COALESCE(
        (SELECT min(p.seq) FROM {schema}.endpoint_pending p
         WHERE p.endpoint = g.endpoint AND p.grp = g.name),
        g.last_seq + 1)) INTO floor_seq
    FROM {schema}.endpoint_groups g WHERE g.endpoint = p_endpoint;
    IF floor_seq IS NOT NULL THEN
        DELETE FROM {schema}.endpoint_messages m WHERE m.endpoint = p_endpoint AND m.seq < floor_seq;
        GET DIAGNOSTICS gone = ROW_COUNT;
    END IF;
    RETURN gone;
END $$;

-- Retention of what process managers leave: expired tombstones and
-- expired tallies with their items, `p_batch` tallies and a hundred
-- times as many tombstone rows (one per message id) per call.
CREATE FUNCTION {schema}.housekeep_process(p_batch integer,
    OUT tombstones integer, OUT tallies integer)
LANGUAGE plpgsql AS $$
DECLARE
    gone bigint[];
BEGIN
    DELETE FROM {schema}.process_tombstones t
    WHERE (t.process, t.kind, t.field, t.value, t.message_id) IN (
        SELECT x.process, x.kind, x.field, x.value, x.message_id
        FROM {schema}.process_tombstones x WHERE x.expires_at <= clock_timestamp()
        LIMIT p_batch::bigint * 100 FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS tombstones = ROW_COUNT;
    SELECT COALESCE(array_agg(x.id), '{}') INTO gone FROM (
        SELECT t.id FROM {schema}.tallies t WHERE t.expires_at <= clock_timestamp()
        ORDER BY t.expires_at LIMIT p_batch) AS x;
    -- Items first, then the head: the order a check locks them in.
    DELETE FROM {schema}.tally_items WHERE tally = ANY(gone);
    DELETE FROM {schema}.tallies t WHERE t.id = ANY(gone) AND t.expires_at <= clock_timestamp();
    GET DIAGNOSTICS tallies = ROW_COUNT;
END $$;
