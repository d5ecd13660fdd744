-- Messages that arrive before their instance, and messages of one
-- instance in the order they were sent.
--
--
-- 1. Holds. Messages held for an instance that does not exist yet
-- (`ProcessCommit::hold`): a continuing message that found none waits as
-- a timer row due when its hold ends, marked with what it waits for
-- (`held_field` NULL: an instance id), until the write that creates the
-- instance or claims the entry moves it onto the queue, or its hold ends
-- and the timer poller does, like any timeout. Both sides take the
-- advisory lock of what they touch (`process_lock`), so a hold and the
-- write that would release it never pass each other unseen.
ALTER TABLE {schema}.process_timers
    ADD COLUMN held_process text,
    ADD COLUMN held_field text,
    ADD COLUMN held_value text,
    ADD COLUMN held_message text;
CREATE INDEX process_timers_held ON {schema}.process_timers (held_process, held_value, id)
    WHERE held_process IS NOT NULL;

-- Holds message `p_message_id` (`p_payload`, due at `p_due_ms`) for
-- `p_value` of `p_field` (NULL: the instance `p_value`) and settles its
-- delivery, unless: what it waits for exists (`code` -2), a tombstone
-- there remembers it (-6), `p_cap` are held for the value already (-8,
-- `detail` how many). A message held for the value already is not held
-- twice (`code` 1).
CREATE FUNCTION {schema}.process_hold(p_process text, p_field text, p_value text,
    p_message_id text, p_due_ms bigint, p_payload text, p_cap integer,
    p_settle text, p_queue_id bigint, p_delivery uuid,
    OUT code integer, OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    code := 0;
    IF p_field IS NULL THEN
        PERFORM {schema}.process_lock(p_process, p_value, '[]'::jsonb);
        IF EXISTS (SELECT 1 FROM {schema}.process_instances
                   WHERE process = p_process AND id = p_value) THEN
            code := -2; RETURN;
        END IF;
    ELSE
        PERFORM {schema}.process_lock(p_process, '', jsonb_build_array(jsonb_build_array(p_field, p_value)));
        IF EXISTS (SELECT 1 FROM {schema}.process_entries
                   WHERE process = p_process AND field = p_field AND value = p_value) THEN
            code := -2; RETURN;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.process_tombstones t
               WHERE t.process = p_process AND t.message_id = p_message_id
                 AND t.expires_at > clock_timestamp()
                 AND t.kind = CASE WHEN p_field IS NULL THEN 0 ELSE 1 END
                 AND t.field = COALESCE(p_field, '') AND t.value = p_value) THEN
        code := -6; RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.process_timers
               WHERE held_process = p_process AND held_value = p_value
                 AND held_field IS NOT DISTINCT FROM p_field AND held_message = p_message_id) THEN
        code := 1;
    ELSE
        SELECT count(*) INTO n FROM {schema}.process_timers
        WHERE held_process = p_process AND held_value = p_value
          AND held_field IS NOT DISTINCT FROM p_field;
        IF n >= p_cap THEN
            code := -8; detail := n::text; RETURN;
        END IF;
        INSERT INTO {schema}.process_timers (due_ms, payload, held_process, held_field, held_value,
            held_message)
        VALUES (p_due_ms, p_payload, p_process, p_field, p_value, p_message_id);
    END IF;
    PERFORM {schema}.settle(p_settle, p_queue_id, p_delivery, NULL, NULL, NULL, NULL, NULL);
END $$;

-- Moves the messages held for instance `p_created` (NULL: the write does
-- not create one) and for the entries `p_claimed` (`[[field, value], ..]`)
-- onto the queue, in the order they were held; returns how many. Called
-- in the transaction of the write that creates or claims them, after
-- `process_commit` took their locks.
CREATE FUNCTION {schema}.release_held(p_process text, p_created text, p_claimed jsonb)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    moved integer;
BEGIN
    WITH held AS (
        DELETE FROM {schema}.process_timers t
        WHERE t.held_process = p_process
          AND ((t.held_field IS NULL AND t.held_value = p_created)
               OR (t.held_field, t.held_value) IN (
                   SELECT e->>0, e->>1 FROM jsonb_array_elements(p_claimed) AS e))
        RETURNING t.id, t.payload)
    SELECT count({schema}.put(1::smallint, h.payload, 0, 0)) INTO moved
    FROM (SELECT * FROM held ORDER BY id) AS h;
    RETURN moved;
END $$;


-- 2. Lanes. Every engine reads every process-manager message here (one
-- database keeps everything together: nothing is partitioned), so two
-- engines could handle two messages of one instance at once, the later
-- one first. A process-manager message has a lane: its process manager
-- and what it is routed by (the instance it names, else its correlation
-- value), set on insert from its payload, whoever writes it (an engine of
-- any version, a function of this schema). A message is taken only once
-- no earlier message of its lane is on the queue, taken or not: the
-- messages of a lane are handled one at a time, in the order they were
-- enqueued, across engines. A message without a lane (an older row, one
-- whose payload names neither) is taken as before.
ALTER TABLE {schema}.queue ADD COLUMN lane text;
CREATE INDEX queue_lanes ON {schema}.queue (lane, id) WHERE lane IS NOT NULL;

CREATE FUNCTION {schema}.queue_lane() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    m jsonb;
BEGIN
    IF NEW.kind = 1 AND NEW.lane IS NULL THEN
        BEGIN
            m := NEW.payload::jsonb;
            NEW.lane := (m->>'process') || ':' || COALESCE(m->>'instance_id', m->>'key');
        EXCEPTION WHEN others THEN
            -- Not JSON: no lane (the reader dead-letters it).
            NEW.lane := NULL;
        END;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER queue_lane BEFORE INSERT ON {schema}.queue
    FOR EACH ROW EXECUTE FUNCTION {schema}.queue_lane();

-- (The messages on the queue when this runs keep no lane: they are taken
-- as before, and the next messages of their instances line up behind
-- nothing they hold.)

CREATE OR REPLACE FUNCTION {schema}.take_leased(p_consumer text, p_kinds smallint[], p_max integer,
    p_visibility_ms bigint)
RETURNS TABLE (id bigint, payload text, deliveries integer, claim uuid, lock_code integer,
    token text, fence bigint, record jsonb, cancel_ms bigint)
-- The queue's statistics are rarely right (it empties and fills between
-- two ANALYZEs): a planner that believes a backlog is small sorts all of
-- it. Only the index read in order is allowed (no bitmap, no sequential
-- scan), and no JIT (a disabled plan's cost would look worth compiling).
LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off AS $$
DECLARE
    -- A variable, not clock_timestamp() (volatile), so that the index
    -- bounds the scan.
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH taken AS (
        UPDATE {schema}.queue q
        SET consumer = p_consumer, claim = gen_random_uuid(), deliveries = q.deliveries + 1,
            visible_at = clock_timestamp() + p_visibility_ms * interval '1 millisecond'
        FROM (
            -- Per kind, so that each reads the index in order and stops
            -- after `p_max` rows: one scan for `kind = ANY(..)` would sort
            -- every due message of the backlog on every take. Rows locked
            -- here but not among the first `p_max` are free again at the
            -- statement's commit.
            SELECT c.id FROM unnest(p_kinds) AS k(kind)
            CROSS JOIN LATERAL (
                SELECT q2.id, q2.visible_at FROM {schema}.queue q2
                WHERE q2.kind = k.kind AND q2.visible_at <= v_now
                  -- A process-manager message waits behind the earlier
                  -- messages of its lane, taken or not (see `lane`).
                  AND (q2.lane IS NULL OR NOT EXISTS (
                      SELECT 1 FROM {schema}.queue q3
                      WHERE q3.lane = q2.lane AND q3.id < q2.id))
                ORDER BY q2.visible_at, q2.id
                LIMIT p_max
                FOR UPDATE SKIP LOCKED
            ) c
            ORDER BY c.visible_at, c.id
            LIMIT p_max
        ) due
        WHERE q.id = due.id
        RETURNING q.id, q.payload, q.deliveries, q.claim, q.kind, q.task_id
    ),
    -- A task's lease goes with the first of its messages taken here.
    first AS (
        SELECT DISTINCT ON (t.task_id) t.task_id, t.id AS queue_id
        FROM taken t WHERE t.kind = 0 AND t.task_id IS NOT NULL
        ORDER BY t.task_id, t.id
    ),
    locked AS (
        UPDATE {schema}.tasks k
        SET fence = k.fence + 1, lock_token = replace(gen_random_uuid()::text, '-', ''),
            lock_until = clock_timestamp() + p_visibility_ms * interval '1 millisecond'
        FROM first f
        WHERE k.id = f.task_id AND (k.lock_until IS NULL OR k.lock_until <= clock_timestamp())
        RETURNING f.queue_id, k.id AS task_id, k.lock_token, k.fence, k.cancel_ms, k.head, k.version
    )
    SELECT t.id, t.payload, t.deliveries, t.claim,
        CASE WHEN l.queue_id IS NOT NULL THEN 0
             WHEN t.kind = 0 AND EXISTS (SELECT 1 FROM {schema}.tasks x WHERE x.id = t.task_id) THEN -4
        END,
        l.lock_token, l.fence,
        CASE WHEN l.queue_id IS NOT NULL THEN {schema}.task_document(l.task_id, l.head, l.version) END,
        l.cancel_ms
    FROM taken t LEFT JOIN locked l ON l.queue_id = t.id
    ORDER BY t.id;
END $$;

-- 3. Endpoints that do not drop. An endpoint a consumer group reads (a
-- relay, a consumer) is an outbox: a message no group settled is never
-- trimmed away, so one that holds its cap refuses the write (SQLSTATE
-- SG001, which the engine reads as the endpoint being full: the handler's
-- message waits, nothing is lost) instead of deleting its oldest. An
-- endpoint no group reads keeps its newest `p_cap`, as before.
CREATE OR REPLACE FUNCTION {schema}.endpoint_append(p_endpoints text[], p_envelopes text[], p_cap bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e text;
    n bigint;
    top bigint;
    read_by_a_group boolean;
    held bigint;
BEGIN
    FOR e, n IN
        SELECT x.name, count(*) FROM unnest(p_endpoints) AS x(name) GROUP BY x.name ORDER BY x.name
    LOOP
        INSERT INTO {schema}.endpoints AS p (name, last_seq) VALUES (e, n)
        ON CONFLICT (name) DO UPDATE SET last_seq = p.last_seq + n
        RETURNING p.last_seq INTO top;
        read_by_a_group := EXISTS (SELECT 1 FROM {schema}.endpoint_groups g WHERE g.endpoint = e);
        IF read_by_a_group THEN
            -- Trimming removes from the oldest on, so what is kept runs
            -- from the lowest sequence number to the last (one index step).
            SELECT (top - n) - min(m.seq) + 1 INTO held
            FROM {schema}.endpoint_messages m WHERE m.endpoint = e;
            held := COALESCE(held, 0);
            IF held + n > p_cap THEN
                RAISE EXCEPTION USING ERRCODE = 'SG001',
                    MESSAGE = format('endpoint `%s` is full: %s messages wait for its consumers', e, held);
            END IF;
        END IF;
        INSERT INTO {schema}.endpoint_messages (endpoint, seq, envelope)
        SELECT e, top - n + row_number() OVER (ORDER BY m.i), m.envelope
        FROM unnest(p_endpoints, p_envelopes) WITH ORDINALITY AS m(name, envelope, i)
        WHERE m.name = e;
        IF NOT read_by_a_group AND top > p_cap THEN
            DELETE FROM {schema}.endpoint_pending WHERE endpoint = e AND seq <= top - p_cap;
            DELETE FROM {schema}.endpoint_messages WHERE endpoint = e AND seq <= top - p_cap;
        END IF;
    END LOOP;
END $$;
