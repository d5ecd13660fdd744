-- The core of the SQLite store: tasks with their leases, claims, audit
-- log and cancellation flags; the work queue; the dead letters. Times are
-- milliseconds since the Unix epoch, on this host's clock (one process
-- owns the file, so there is no other clock to agree with).
--
-- Released migrations are history: never edit this file (its checksum is
-- pinned in `sqlite/migrate.rs`); change the schema in a new one.

-- A task's record (JSON, its audit log apart), its version, its lease
-- (the fence counts every lease taken), its cancellation flag (with the
-- token of the request that set it) and when it expires once finished.
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    saga TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    version INTEGER NOT NULL,
    record TEXT NOT NULL,
    fence INTEGER NOT NULL DEFAULT 0,
    lock_token TEXT,
    lock_until INTEGER,
    cancel_ms INTEGER,
    cancel_token TEXT,
    expires_ms INTEGER
) STRICT;

-- Listing newest first, by saga (and status).
CREATE INDEX tasks_by_saga ON tasks (saga, created_ms DESC, id DESC);
CREATE INDEX tasks_by_status ON tasks (saga, status, created_ms DESC, id DESC);
-- Retention.
CREATE INDEX tasks_expiring ON tasks (expires_ms) WHERE expires_ms IS NOT NULL;

-- The names of the attempts claimed, kept as long as the task.
CREATE TABLE claims (
    task_id TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (task_id, name)
) STRICT, WITHOUT ROWID;

-- The audit log, kept apart from the record so that a write appends its
-- new entries only, and capped by the write that appends.
CREATE TABLE audit (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
) STRICT, WITHOUT ROWID;

-- The work queue: a message is deliverable from `due_ms` (its delay, or
-- the visibility deadline of the delivery that holds it: one not settled
-- by then is delivered again). `deliveries` counts its deliveries, and
-- names the one that may settle it. `kind`: 0 a saga message, 1 a
-- process-manager message, 2 an entry that decodes as neither.
CREATE TABLE queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    raw BLOB NOT NULL,
    kind INTEGER NOT NULL,
    deliveries INTEGER NOT NULL DEFAULT 0,
    due_ms INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    taken INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE INDEX queue_due ON queue (due_ms, id);

-- Messages parked for an operator, in parking order.
CREATE TABLE dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    payload TEXT NOT NULL,
    reason TEXT NOT NULL,
    task_id TEXT,
    at_ms INTEGER NOT NULL,
    truncated INTEGER
) STRICT;

-- Flow-control limits: the limit machine's state of each `(limit, key)`
-- (`key` is '' unkeyed, else '=' and the key's value), dropped once idle.
CREATE TABLE limits (
    name TEXT NOT NULL,
    key TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (name, key)
) STRICT, WITHOUT ROWID;
