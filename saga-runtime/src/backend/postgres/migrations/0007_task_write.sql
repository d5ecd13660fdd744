-- One task write, interpreted (`backend/write.rs`): the guards, then the
-- effects, in one call.
--
-- Before this migration each kind of task write had a function of its
-- own (`record_attempt`, `commit_task`), each restating the checks. This
-- one takes the write as the engine describes it: the guards (fence and
-- version always; not cancelled when `p_unless_cancelled`), and each
-- effect's arguments, NULL for an effect the write does not carry. It
-- decides nothing: which effects a write carries, and with what, was
-- decided before it got here.
--
-- The guards and the effects on the task's own row (put, renew the lease,
-- retain, unlock) are one conditional update: the guards are its `WHERE`,
-- so a refused write changes no row and the refusal is read afterwards
-- (`refusal`: a missing task first, then the vocabulary's order: fence,
-- version, cancellation). A write carries each effect at most once, in
-- the vocabulary's order (the engine refuses to send another), so an
-- unlock after a renewal leaves the lease released.
--
-- What it stores is what `record_attempt` and `commit_task` store, and
-- those stay: engines of the previous version that are running when this
-- migration is applied go on calling them, beside engines that call this
-- one (an engine of the previous version that starts afterwards refuses
-- the newer schema, as every engine does).
CREATE FUNCTION {schema}.apply_task_write(p_id uuid, p_fence bigint, p_version bigint,
    p_unless_cancelled boolean,
    -- Put
    p_status text, p_head jsonb, p_steps jsonb, p_audit jsonb, p_audit_cap integer,
    -- Claim
    p_claim text,
    -- Renew: the lease's new time to live, and the delivery kept
    p_renew_ms bigint, p_token text, p_renew_queue_id bigint, p_renew_delivery uuid,
    p_visibility_ms bigint,
    -- Enqueue
    p_next text, p_next_delay_ms bigint,
    -- Settle ('none' when the write settles nothing)
    p_settle text, p_queue_id bigint, p_delivery uuid, p_payload text, p_reason text, p_size bigint,
    p_dead_letter bigint,
    -- Retain (`p_retain`: whether the write carries it; `p_expire_ms` NULL
    -- keeps the task and undoes an earlier expiry)
    p_retain boolean, p_expire_ms bigint,
    -- Unlock
    p_unlock boolean,
    OUT code integer, OUT detail text, OUT version bigint, OUT claimed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    seq bigint;
    renewed boolean := p_renew_ms IS NOT NULL;
BEGIN
    UPDATE {schema}.tasks t
    SET version = CASE WHEN p_status IS NULL THEN t.version ELSE t.version + 1 END,
        status = coalesce(p_status, t.status),
        head = coalesce(p_head, t.head),
        audit_seq = t.audit_seq + coalesce(jsonb_array_length(p_audit), 0),
        lock_until = CASE WHEN p_unlock IS TRUE AND t.lock_token = p_token THEN NULL
                          WHEN renewed AND t.lock_token = p_token
                          THEN clock_timestamp() + p_renew_ms * interval '1 millisecond'
                          ELSE t.lock_until END,
        lock_token = CASE WHEN p_unlock IS TRUE AND t.lock_token = p_token THEN NULL ELSE t.lock_token END,
        expires_at = CASE WHEN p_retain IS NOT TRUE THEN t.expires_at
                          WHEN p_expire_ms IS NULL THEN NULL
                          ELSE clock_timestamp() + p_expire_ms * interval '1 millisecond' END
    WHERE t.id = p_id AND t.fence = p_fence AND t.version = p_version
      AND NOT (coalesce(p_unless_cancelled, false) AND t.cancel_ms IS NOT NULL)
    RETURNING t.version, t.audit_seq INTO version, seq;
    IF NOT FOUND THEN
        SELECT r.code, r.detail INTO code, detail
        FROM {schema}.refusal(p_id, p_fence, p_version, coalesce(p_unless_cancelled, false)) r;
        version := NULL;
        RETURN;
    END IF;
    code := 0;
    claimed := false;
    IF p_status IS NOT NULL THEN
        PERFORM {schema}.write_rows(p_id, p_steps, p_audit, seq, p_audit_cap);
    END IF;
    IF p_claim IS NOT NULL THEN
        INSERT INTO {schema}.task_claims (task_id, claim) VALUES (p_id, p_claim) ON CONFLICT DO NOTHING;
        claimed := FOUND;
    END IF;
    IF renewed THEN
        UPDATE {schema}.queue SET visible_at = clock_timestamp() + p_visibility_ms * interval '1 millisecond'
        WHERE id = p_renew_queue_id AND claim = p_renew_delivery;
    END IF;
    IF p_next IS NOT NULL THEN
        PERFORM {schema}.put(0::smallint, p_next, p_next_delay_ms, 0, p_id);
    END IF;
    PERFORM {schema}.settle(p_settle, p_queue_id, p_delivery, p_payload, p_reason, p_size, p_id, p_dead_letter);
END $$;
