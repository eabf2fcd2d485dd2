-- The occurrence key is schedule-major, and it is the schedule's index: one index fewer on
-- the hottest table (docs/DESIGN.md, "Why is the occurrence key schedule-major?"). Before,
-- the key was UNIQUE (scheduled_for, schedule_id, version) — time-major, so that planning
-- appended to it — beside occurrences_schedule (schedule_id, scheduled_for) for everything
-- asked per schedule, and every occurrence planned paid for both. The key in schedule order
-- serves what occurrences_schedule did (the uniqueness of (schedule_id, version,
-- scheduled_for) is the same whatever the column order); listings across schedules in
-- planned order read the id index, whose ids lead with their planned instant
-- (campanile_core::occurrence_id).
-- A table constraint cannot be altered in SQLite, so the table is rebuilt: every row kept
-- as it is (seq included: attempts name their occurrence by it), the indexes made again.
-- The rebuild copies the table once, inside the migration's transaction (6.8 s for a million
-- occurrences here; the node starts once it is done).
ALTER TABLE occurrences RENAME TO occurrences_before_key_by_schedule;
CREATE TABLE occurrences (
    seq                 INTEGER PRIMARY KEY,
    id                  BLOB    NOT NULL UNIQUE,
    tenant_id           INTEGER NOT NULL,
    schedule_id         BLOB    NOT NULL,
    version             INTEGER NOT NULL,
    scheduled_for       INTEGER NOT NULL,
    available_at        INTEGER NOT NULL,
    queue               TEXT    NOT NULL,
    priority            INTEGER NOT NULL,
    state               TEXT    NOT NULL,
    epoch               INTEGER NOT NULL DEFAULT 0,
    owner               TEXT,
    lease_until         INTEGER,
    claimed_at          INTEGER,
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL,
    backoff_initial_ms  INTEGER NOT NULL,
    backoff_max_ms      INTEGER NOT NULL,
    overlap             INTEGER NOT NULL DEFAULT 0,   -- 0 ALLOW, 1 SKIP_IF_RUNNING, 2 QUEUE_ONE
    cancel_requested    INTEGER NOT NULL DEFAULT 0,
    result              TEXT,
    last_error_class    TEXT,
    last_error          TEXT,
    created_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    lease_ms            INTEGER NOT NULL DEFAULT 30000,
    due_at              INTEGER,
    ran_until           INTEGER,
    UNIQUE (schedule_id, scheduled_for, version)
);
INSERT INTO occurrences SELECT seq, id, tenant_id, schedule_id, version, scheduled_for, available_at,
       queue, priority, state, epoch, owner, lease_until, claimed_at, attempts, max_attempts,
       backoff_initial_ms, backoff_max_ms, overlap, cancel_requested, result, last_error_class,
       last_error, created_at, finished_at, lease_ms, due_at, ran_until
  FROM occurrences_before_key_by_schedule;
DROP TABLE occurrences_before_key_by_schedule;
CREATE INDEX occurrences_pending ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0;
CREATE INDEX occurrences_pending_constrained
    ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
CREATE INDEX occurrences_running ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING';
CREATE INDEX occurrences_running_schedule ON occurrences (schedule_id)
    WHERE state = 'RUNNING' AND overlap <> 0;
CREATE INDEX occurrences_ran_constrained_schedule
    ON occurrences (schedule_id, ran_until)
    WHERE overlap <> 0 AND ran_until IS NOT NULL;
CREATE INDEX occurrences_pending_constrained_schedule
    ON occurrences (schedule_id, priority DESC, available_at, seq)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
