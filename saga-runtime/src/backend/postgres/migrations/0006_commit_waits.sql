-- A commit enqueues the next message when the engine says.
--
-- `commit_task` of 0001 enqueued a delayed next message at once whenever
-- the task's cancellation flag was set. That decided for the engine, and
-- wrongly once the cancellation had been applied: the flag stays set, so
-- the compensations of a cancelled task were retried with no backoff at
-- all, whatever their `compensation_retry_policy` said. The engine now
-- decides: a running task that waits (a retry's backoff, an open breaker,
-- a limit) commits with `p_unless_cancelled`, is refused once a
-- cancellation is requested, and begins the cancellation instead. Same
-- signature, so an engine of the previous version calls it unchanged (a
-- cancellation requested while one of its tasks waits is then applied
-- by the wake-up the request enqueues, as before).
CREATE OR REPLACE FUNCTION {schema}.commit_task(p_id uuid, p_fence bigint, p_version bigint, p_status text,
    p_head jsonb, p_steps jsonb, p_audit jsonb, p_audit_cap integer, p_unless_cancelled boolean,
    p_token text, p_next text, p_next_delay_ms bigint,
    p_settle text, p_queue_id bigint, p_delivery uuid, p_payload text, p_reason text, p_size bigint,
    p_dead_letter bigint, p_expire_ms bigint,
    OUT code integer, OUT detail text, OUT version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    seq bigint;
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
    RETURNING t.version, t.audit_seq INTO version, seq;
    IF NOT FOUND THEN
        SELECT r.code, r.detail INTO code, detail
        FROM {schema}.refusal(p_id, p_fence, p_version, p_unless_cancelled) r;
        version := NULL;
        RETURN;
    END IF;
    code := 0;
    PERFORM {schema}.write_rows(p_id, p_steps, p_audit, seq, p_audit_cap);
    IF p_next IS NOT NULL THEN
        PERFORM {schema}.put(0::smallint, p_next, p_next_delay_ms, 0, p_id);
    END IF;
    PERFORM {schema}.settle(p_settle, p_queue_id, p_delivery, p_payload, p_reason, p_size, p_id, p_dead_letter);
END $$;
