-- The core: tasks, their steps, claims and audit log; the work queue; dead
-- letters. `{schema}` is the backend's schema (quoted when substituted).
--
-- Every write of the saga protocol is one function call: one statement,
-- one transaction, one round trip, like a script on Redis. Functions check
-- before they write (fence, version, cancellation) and answer a code:
-- 0 written, -1 lock lost, -2 version conflict, -3 missing task,
-- -5 cancellation requested (the codes of the Redis scripts).
--
-- Times that decide leases and visibility are the server's
-- (clock_timestamp()), never a worker's clock.

CREATE TABLE {schema}.tasks (
    id uuid PRIMARY KEY,
    saga text NOT NULL,
    status text NOT NULL,
    version bigint NOT NULL,
    -- The task without its steps and audit log (they have rows of their
    -- own, so a step's write does not rewrite the others).
    head jsonb NOT NULL,
    created_ms bigint NOT NULL,
    -- The lease: every acquisition takes the next fence; a write must
    -- carry the latest.
    fence bigint NOT NULL DEFAULT 0,
    lock_token text,
    lock_until timestamptz,
    -- A cancellation request: when (ms) and by which request.
    cancel_ms bigint,
    cancel_token text,
    -- Set when the task ends and retention applies: removed after.
    expires_at timestamptz,
    -- The sequence number of the task's last audit entry (entries past
    -- the cap are deleted, so it is not their count).
    audit_seq bigint NOT NULL DEFAULT 0
)
-- Room on each page for the new version of a row that a step's write
-- makes: an update that changes no indexed column then stays on its page
-- (a HOT update) and writes no index entry.
WITH (fillfactor = 80);
CREATE INDEX tasks_by_saga ON {schema}.tasks (saga, created_ms DESC, id DESC);
CREATE INDEX tasks_by_status ON {schema}.tasks (saga, status, created_ms DESC, id DESC);
CREATE INDEX tasks_expiring ON {schema}.tasks (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE {schema}.task_steps (
    task_id uuid NOT NULL,
    idx integer NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (task_id, idx)
)
-- Room for a step's new record on its page (a HOT update).
WITH (fillfactor = 80);

CREATE TABLE {schema}.task_claims (
    task_id uuid NOT NULL,
    claim text NOT NULL,
    PRIMARY KEY (task_id, claim)
);

CREATE TABLE {schema}.task_audit (
    task_id uuid NOT NULL,
    seq bigint NOT NULL,
    entry jsonb NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- The work queue. A row is visible from `visible_at`: a delayed message
-- (a retry's backoff) is a row visible later, and a delivered one is
-- invisible until its visibility timeout, then delivered again. `claim`
-- names the delivery that holds it: settling a row another delivery took
-- since does nothing. `deliveries` counts the deliveries not answered (a
-- hand-back by a live worker answers one).
CREATE TABLE {schema}.queue (
    id bigserial PRIMARY KEY,
    -- 0: a saga message, 1: a process-manager message, 2: an entry that
    -- does not decode (for any worker, to dead-letter).
    kind smallint NOT NULL,
    payload text NOT NULL,
    visible_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    deliveries integer NOT NULL DEFAULT 0,
    consumer text,
    claim uuid,
    -- The task a saga message is for (written with it): a read takes the
    -- task's lease without parsing the payload.
    task_id uuid
);
CREATE INDEX queue_visible ON {schema}.queue (kind, visible_at, id);

CREATE TABLE {schema}.dead_letters (
    id bigserial PRIMARY KEY,
    payload text NOT NULL,
    reason text NOT NULL,
    task_id uuid,
    at_ms bigint NOT NULL,
    -- The payload's size when it was cut to the size limit.
    size bigint,
    parked_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX dead_letters_parked ON {schema}.dead_letters (parked_at);

-- Wakes idle readers: a message that is visible now.
--
-- (The functions of the protocol are PL/pgSQL even where one SQL
-- statement would do: PL/pgSQL keeps its plans for the session, while a
-- `LANGUAGE sql` function that is not inlined is parsed and planned again
-- on every call.)
CREATE FUNCTION {schema}.wake() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
END $$;

-- Puts `payload` (for task `p_task`, if a saga message) on the queue,
-- visible after `delay_ms`, without waking
-- anyone: for the engine's own writes (a step's next message, a hand-back,
-- a process manager's sends). A transaction that notifies holds a
-- database-wide lock through its commit, fsync included, so that
-- notifications queue in commit order: were every step's commit to
-- notify, steps would commit one at a time. The engine wakes its own
-- readers at once and notifies the other engines after the commit, once
-- for many writes. Returns its id.
CREATE FUNCTION {schema}.put(p_kind smallint, p_payload text, p_delay_ms bigint, p_deliveries integer,
    p_task uuid DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO {schema}.queue (kind, payload, visible_at, deliveries, task_id)
    VALUES (p_kind, p_payload, clock_timestamp() + p_delay_ms * interval '1 millisecond', p_deliveries,
            p_task)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- Enqueues `payload`, visible after `delay_ms`, and wakes idle readers in
-- the same transaction: at once to take it, or to sleep until it is due.
-- For writes from outside an engine (a start, a publish, in the caller's
-- transaction or not; an operator's requeue), whose writer may be gone
-- before anything could notify for it. Returns its id.
CREATE FUNCTION {schema}.enqueue(p_kind smallint, p_payload text, p_delay_ms bigint, p_deliveries integer,
    p_task uuid DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    new_id := {schema}.put(p_kind, p_payload, p_delay_ms, p_deliveries, p_task);
    PERFORM {schema}.wake();
    RETURN new_id;
END $$;

-- Stores a new task with its steps and enqueues its first message, unless
-- a task with this id exists. Returns whether it was created.
CREATE FUNCTION {schema}.create_task(
    p_id uuid, p_saga text, p_status text, p_head jsonb, p_steps jsonb, p_audit jsonb,
    p_created_ms bigint, p_first text
) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.tasks (id, saga, status, version, head, created_ms, audit_seq)
    VALUES (p_id, p_saga, p_status, 1, p_head, p_created_ms, jsonb_array_length(p_audit))
    ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.task_steps (task_id, idx, record)
    SELECT p_id, (s.ordinality - 1)::integer, s.value
    FROM jsonb_array_elements(p_steps) WITH ORDINALITY AS s(value, ordinality);
    INSERT INTO {schema}.task_audit (task_id, seq, entry)
    SELECT p_id, e.ordinality, e.value FROM jsonb_array_elements(p_audit) WITH ORDINALITY AS e(value, ordinality);
    PERFORM {schema}.enqueue(0::smallint, p_first, 0, 0, p_id);
    RETURN true;
END $$;

-- A task as the engine reads it: its head with its version, steps and
-- audit log.
CREATE FUNCTION {schema}.task_document(p_id uuid, p_head jsonb, p_version bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN p_head
        || jsonb_build_object(
            'version', p_version,
            'steps', COALESCE((SELECT jsonb_agg(s.record ORDER BY s.idx) FROM {schema}.task_steps s WHERE s.task_id = p_id), '[]'::jsonb),
            'audit_log', COALESCE((SELECT jsonb_agg(a.entry ORDER BY a.seq) FROM {schema}.task_audit a WHERE a.task_id = p_id), '[]'::jsonb));
END $$;

-- The task as stored.
CREATE FUNCTION {schema}.task_record(p_id uuid) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT {schema}.task_document(t.id, t.head, t.version) FROM {schema}.tasks t WHERE t.id = p_id);
END $$;

-- Takes the task's lease if it is free (no waiting) and loads the task:
-- `code` 0 with the lease's fence, the record and the cancellation time;
-- -4 busy; -3 missing (nothing taken).
CREATE FUNCTION {schema}.lock_task(p_id uuid, p_token text, p_ttl_ms bigint,
    OUT code integer, OUT fence bigint, OUT record jsonb, OUT cancel_ms bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.tasks t
    SET fence = t.fence + 1, lock_token = p_token,
        lock_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
    WHERE t.id = p_id AND (t.lock_until IS NULL OR t.lock_until <= clock_timestamp())
    RETURNING t.fence, t.cancel_ms INTO fence, cancel_ms;
    IF FOUND THEN
        code := 0;
        record := {schema}.task_record(p_id);
    ELSIF EXISTS (SELECT 1 FROM {schema}.tasks WHERE id = p_id) THEN
        code := -4;
    ELSE
        code := -3;
    END IF;
END $$;

-- Why a task write was refused (its conditional update changed no row):
-- the task is missing (-3), the lease's fence is not the latest (-1),
-- the version is not the one the write was based on (-2, with the actual
-- one), or a cancellation was requested (-5, with its time). Each of
-- these only ever gets worse, so what the update found this finds too.
CREATE FUNCTION {schema}.refusal(p_id uuid, p_fence bigint, p_version bigint, p_unless_cancelled boolean,
    OUT code integer, OUT detail text)
LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    SELECT fence, version, cancel_ms INTO t FROM {schema}.tasks WHERE id = p_id;
    IF NOT FOUND THEN
        code := -3;
    ELSIF t.fence <> p_fence THEN
        code := -1;
    ELSIF t.version = p_version AND p_unless_cancelled AND t.cancel_ms IS NOT NULL THEN
        code := -5; detail := t.cancel_ms::text;
    ELSE
        code := -2; detail := t.version::text;
    END IF;
END $$;

-- The rows a task write adds besides the task's own: the steps that
-- changed (`[[idx, record], ..]`) and the new audit entries, numbered up
-- to `p_audit_seq` (the task's count after the write), the log kept to
-- `p_audit_cap` entries.
CREATE FUNCTION {schema}.write_rows(p_id uuid, p_steps jsonb, p_audit jsonb, p_audit_seq bigint,
    p_audit_cap integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    n integer := jsonb_array_length(p_audit);
    updated integer;
BEGIN
    IF jsonb_array_length(p_steps) > 0 THEN
        -- The task's steps have rows from its creation: an update (cheaper
        -- than an insert that finds a conflict), unless a step is new.
        UPDATE {schema}.task_steps t SET record = s.value->1
        FROM jsonb_array_elements(p_steps) AS s(value)
        WHERE t.task_id = p_id AND t.idx = (s.value->>0)::integer;
        GET DIAGNOSTICS updated = ROW_COUNT;
        IF updated < jsonb_array_length(p_steps) THEN
            INSERT INTO {schema}.task_steps (task_id, idx, record)
            SELECT p_id, (s.value->>0)::integer, s.value->1 FROM jsonb_array_elements(p_steps) AS s(value)
            ON CONFLICT (task_id, idx) DO UPDATE SET record = excluded.record;
        END IF;
    END IF;
    IF n > 0 THEN
        INSERT INTO {schema}.task_audit (task_id, seq, entry)
        SELECT p_id, p_audit_seq - n + e.ordinality, e.value
        FROM jsonb_array_elements(p_audit) WITH ORDINALITY AS e(value, ordinality);
        IF p_audit_seq > p_audit_cap THEN
            DELETE FROM {schema}.task_audit WHERE task_id = p_id AND seq <= p_audit_seq - p_audit_cap;
        END IF;
    END IF;
END $$;

-- Records an attempt before its call: the task, and the attempt's claim
-- (unique per task: `claimed` says whether this write won it). Optionally
-- renews the lease and the delivery (going on with a task under the same
-- message), and refuses once a cancellation is requested.
CREATE FUNCTION {schema}.record_attempt(p_id uuid, p_fence bigint, p_version bigint, p_status text,
    p_head jsonb, p_steps jsonb, p_audit jsonb, p_audit_cap integer, p_claim text,
    p_unless_cancelled boolean, p_renew_ms bigint, p_token text, p_queue_id bigint,
    p_delivery uuid, p_visibility_ms bigint,
    OUT code integer, OUT detail text, OUT version bigint, OUT claimed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    seq bigint;
BEGIN
    -- The checks and the task's write in one conditional update.
    UPDATE {schema}.tasks t
    SET version = t.version + 1, status = p_status, head = p_head,
        audit_seq = t.audit_seq + jsonb_array_length(p_audit),
        lock_until = CASE WHEN p_renew_ms IS NOT NULL AND t.lock_token = p_token
                          THEN clock_timestamp() + p_renew_ms * interval '1 millisecond'
                          ELSE t.lock_until END
    WHERE t.id = p_id AND t.fence = p_fence AND t.version = p_version
      AND NOT (p_unless_cancelled AND t.cancel_ms IS NOT NULL)
    RETURNING t.version, t.audit_seq INTO version, seq;
    IF NOT FOUND THEN
        SELECT r.code, r.detail INTO code, detail
        FROM {schema}.refusal(p_id, p_fence, p_version, p_unless_cancelled) r;
        version := NULL;
        RETURN;
    END IF;
    code := 0;
    PERFORM {schema}.write_rows(p_id, p_steps, p_audit, seq, p_audit_cap);
    INSERT INTO {schema}.task_claims (task_id, claim) VALUES (p_id, p_claim) ON CONFLICT DO NOTHING;
    claimed := FOUND;
    IF p_renew_ms IS NOT NULL THEN
        UPDATE {schema}.queue SET visible_at = clock_timestamp() + p_visibility_ms * interval '1 millisecond'
        WHERE id = p_queue_id AND claim = p_delivery;
    END IF;
END $$;

-- Settles a delivery: `ack` removes it, `dead` parks it with a reason (its
-- payload cut by the caller), `resolve` removes a dead letter instead.
CREATE FUNCTION {schema}.settle(p_how text, p_queue_id bigint, p_delivery uuid, p_payload text,
    p_reason text, p_size bigint, p_task uuid, p_dead_letter bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_how = 'ack' THEN
        DELETE FROM {schema}.queue WHERE id = p_queue_id AND claim = p_delivery;
    ELSIF p_how = 'dead' THEN
        DELETE FROM {schema}.queue WHERE id = p_queue_id AND claim = p_delivery;
        INSERT INTO {schema}.dead_letters (payload, reason, task_id, at_ms, size)
        VALUES (p_payload, p_reason, p_task,
                (extract(epoch FROM clock_timestamp()) * 1000)::bigint, p_size);
    ELSIF p_how = 'resolve' THEN
        DELETE FROM {schema}.dead_letters WHERE id = p_dead_letter;
    END IF;
END $$;

-- The atomic write of the saga protocol: the task, the message that
-- advances it next (now, or after a delay; at once once cancelled), the
-- settlement of the current message, the lease's release and the task's
-- expiry. Refused before anything is written. Notifies nobody: the
-- engine wakes readers and the task's waiters after the commit (see `put`).
CREATE FUNCTION {schema}.commit_task(p_id uuid, p_fence bigint, p_version bigint, p_status text,
    p_head jsonb, p_steps jsonb, p_audit jsonb, p_audit_cap integer, p_unless_cancelled boolean,
    p_token text, p_next text, p_next_delay_ms bigint,
    p_settle text, p_queue_id bigint, p_delivery uuid, p_payload text, p_reason text, p_size bigint,
    p_dead_letter bigint, p_expire_ms bigint,
    OUT code integer, OUT detail text, OUT version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    seq bigint;
    cancelled boolean;
BEGIN
    -- The checks, the task's write, the lease's release and the expiry in
    -- one conditional update.
    UPDATE {schema}.tasks t
    SET version = t.version + 1, status = p_status, head = p_head,
        audit_seq = t.audit_seq + jsonb_array_length(p_audit),
        lock_token = CASE WHEN t.lock_token = p_token THEN NULL ELSE t.lock_token END,
        lock_until = CASE WHEN t.lock_token = p_token THEN NULL ELSE t.lock_until END,
        expires_at = CASE WHEN p_expire_ms IS NULL THEN NULL
                          ELSE clock_timestamp() + p_expire_ms * interval '1 millisecond' END
    WHERE t.id = p_id AND t.fence = p_fence AND t.version = p_version
      AND NOT (p_unless_cancelled AND t.cancel_ms IS NOT NULL)
    RETURNING t.version, t.audit_seq, t.cancel_ms IS NOT NULL INTO version, seq, cancelled;
    IF NOT FOUND THEN
        SELECT r.code, r.detail INTO code, detail
        FROM {schema}.refusal(p_id, p_fence, p_version, p_unless_cancelled) r;
        version := NULL;
        RETURN;
    END IF;
    code := 0;
    PERFORM {schema}.write_rows(p_id, p_steps, p_audit, seq, p_audit_cap);
    IF p_next IS NOT NULL THEN
        PERFORM {schema}.put(0::smallint, p_next,
            CASE WHEN cancelled THEN 0 ELSE p_next_delay_ms END, 0, p_id);
    END IF;
    PERFORM {schema}.settle(p_settle, p_queue_id, p_delivery, p_payload, p_reason, p_size, p_id, p_dead_letter);
END $$;

-- Extends the lease and the delivery while a step runs; answers whether
-- the lease is still held and when cancellation was requested.
CREATE FUNCTION {schema}.heartbeat(p_id uuid, p_token text, p_ttl_ms bigint, p_queue_id bigint,
    p_delivery uuid, p_visibility_ms bigint, OUT held boolean, OUT cancel_ms bigint)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.tasks t SET lock_until = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
    WHERE t.id = p_id AND t.lock_token = p_token AND t.lock_until > clock_timestamp()
    RETURNING t.cancel_ms INTO cancel_ms;
    held := FOUND;
    IF NOT held THEN
        SELECT t.cancel_ms INTO cancel_ms FROM {schema}.tasks t WHERE t.id = p_id;
    END IF;
    UPDATE {schema}.queue SET visible_at = clock_timestamp() + p_visibility_ms * interval '1 millisecond'
    WHERE id = p_queue_id AND claim = p_delivery;
END $$;

-- Records a cancellation request and wakes the task; an earlier request
-- by another token answers its time (and records nothing).
CREATE FUNCTION {schema}.request_cancel(p_id uuid, p_token text, p_now_ms bigint, p_wake text,
    OUT exists_ boolean, OUT earlier_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    SELECT cancel_ms, cancel_token INTO t FROM {schema}.tasks WHERE id = p_id FOR UPDATE;
    exists_ := FOUND;
    IF NOT exists_ THEN
        RETURN;
    END IF;
    IF t.cancel_ms IS NOT NULL THEN
        IF t.cancel_token IS DISTINCT FROM p_token THEN
            earlier_ms := t.cancel_ms;
        END IF;
        RETURN;
    END IF;
    UPDATE {schema}.tasks SET cancel_ms = p_now_ms, cancel_token = p_token WHERE id = p_id;
    PERFORM {schema}.enqueue(0::smallint, p_wake, 0, 0, p_id);
    PERFORM pg_notify('{cancellations}', p_id::text);
END $$;

-- Hands a delivery back, visible after `p_delay_ms`; `p_answered` takes
-- back the delivery it counted. The engine wakes readers (see `put`).
CREATE FUNCTION {schema}.hand_back(p_queue_id bigint, p_delivery uuid, p_delay_ms bigint, p_answered boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.queue
    SET visible_at = clock_timestamp() + p_delay_ms * interval '1 millisecond',
        enqueued_at = clock_timestamp(),
        consumer = NULL, claim = NULL,
        deliveries = CASE WHEN p_answered THEN greatest(deliveries - 1, 0) ELSE deliveries END
    WHERE id = p_queue_id AND claim = p_delivery;
END $$;

-- The queue kind of an entry: a process-manager envelope (1), a saga
-- message (0), or something that is not JSON at all (2). (Its own
-- function: the exception handler must not undo its caller's writes.)
CREATE FUNCTION {schema}.kind_of(p_payload text) RETURNS smallint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE WHEN jsonb_typeof(p_payload::jsonb) = 'object' AND p_payload::jsonb ? 'process'
                THEN 1 ELSE 0 END;
EXCEPTION WHEN others THEN
    RETURN 2;
END $$;

-- Puts a dead letter back on the queue (its message as it was parked).
CREATE FUNCTION {schema}.requeue_dead_letter(p_id bigint,
    OUT exists_ boolean, OUT payload text, OUT reason text, OUT task_id uuid, OUT at_ms bigint, OUT size bigint)
LANGUAGE plpgsql AS $$
DECLARE
    kind smallint;
BEGIN
    DELETE FROM {schema}.dead_letters d WHERE d.id = p_id
    RETURNING d.payload, d.reason, d.task_id, d.at_ms, d.size INTO payload, reason, task_id, at_ms, size;
    exists_ := FOUND;
    IF exists_ THEN
        kind := {schema}.kind_of(payload);
        PERFORM {schema}.enqueue(kind, payload, 0, 0,
            CASE WHEN kind = 0 THEN COALESCE(task_id, {schema}.saga_task_of(payload)) END);
    END IF;
END $$;

-- Retention: removes up to `p_batch` expired tasks with their rows, dead
-- letters older than `p_dead_age_ms` (when given), and the oldest beyond
-- `p_dead_max` except the letters of tasks still parked (an operator
-- requeues a task by its letter).
CREATE FUNCTION {schema}.housekeep(p_batch integer, p_dead_age_ms bigint, p_dead_max bigint,
    OUT tasks integer, OUT dead_letters integer)
LANGUAGE plpgsql AS $$
DECLARE
    gone uuid[];
    aged integer := 0;
    excess integer := 0;
BEGIN
    WITH expired AS (
        DELETE FROM {schema}.tasks WHERE id IN (
            SELECT id FROM {schema}.tasks
            WHERE expires_at IS NOT NULL AND expires_at <= clock_timestamp()
            ORDER BY expires_at LIMIT p_batch FOR UPDATE SKIP LOCKED)
        RETURNING id)
    SELECT COALESCE(array_agg(id), '{}') INTO gone FROM expired;
    DELETE FROM {schema}.task_steps WHERE task_id = ANY(gone);
    DELETE FROM {schema}.task_claims WHERE task_id = ANY(gone);
    DELETE FROM {schema}.task_audit WHERE task_id = ANY(gone);
    tasks := cardinality(gone);
    IF p_dead_age_ms IS NOT NULL THEN
        DELETE FROM {schema}.dead_letters
        WHERE parked_at < clock_timestamp() - p_dead_age_ms * interval '1 millisecond';
        GET DIAGNOSTICS aged = ROW_COUNT;
    END IF;
    DELETE FROM {schema}.dead_letters WHERE id IN (
        SELECT d.id FROM {schema}.dead_letters d
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.tasks t
                          WHERE t.id = d.task_id AND t.status = 'DeadLettered')
        ORDER BY d.id
        LIMIT greatest((SELECT count(*) FROM {schema}.dead_letters) - p_dead_max, 0));
    GET DIAGNOSTICS excess = ROW_COUNT;
    dead_letters := aged + excess;
END $$;

-- How long until the next message of kinds `p_kinds` becomes visible (a
-- delayed one, or one whose delivery expires), in ms; NULL if none will.
-- What an idle reader sleeps for, rather than polling.
CREATE FUNCTION {schema}.next_visible(p_kinds smallint[]) RETURNS double precision
LANGUAGE plpgsql STABLE SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    -- Per kind: each `min` is one step into the index.
    RETURN (SELECT extract(epoch FROM min(n.at) - v_now) * 1000
            FROM unnest(p_kinds) AS k(kind)
            CROSS JOIN LATERAL (
                SELECT min(q.visible_at) AS at FROM {schema}.queue q
                WHERE q.kind = k.kind AND q.visible_at > v_now
            ) n);
END $$;

-- The task a saga message is for; NULL for anything else (an entry that
-- does not decode is not this function's to judge: its own exception
-- handler keeps a bad payload from undoing the caller's writes).
CREATE FUNCTION {schema}.saga_task_of(p_payload text) RETURNS uuid LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (p_payload::jsonb ->> 'task_id')::uuid;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- Takes up to `p_max` visible messages of kinds `p_kinds` for
-- `p_consumer` (each becomes invisible for the visibility timeout under a
-- new claim, and counts one more unanswered delivery), and for each saga
-- message the lease of its task in the same statement (what a worker asks
-- for next): `lock_code` 0 with the lease's token, fence, the task and
-- its cancellation, -4 when another worker holds it (or another message
-- taken here got it), NULL when there is no such task (the worker sees
-- to that).
CREATE FUNCTION {schema}.take_leased(p_consumer text, p_kinds smallint[], p_max integer,
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
