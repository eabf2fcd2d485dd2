-- Campanile schema v1 (PostgreSQL). Instants are BIGINT Unix milliseconds.

CREATE TABLE tenants (
    id                    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  TEXT   NOT NULL UNIQUE,
    created_at            BIGINT NOT NULL,
    max_active_schedules  BIGINT,
    max_triggers_per_sec  BIGINT,
    max_running           BIGINT,
    max_catchup_per_sec   BIGINT
);

CREATE TABLE api_keys (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   BIGINT REFERENCES tenants(id),
    key_hash    BYTEA  NOT NULL UNIQUE,
    prefix      TEXT   NOT NULL,
    is_admin    BOOLEAN NOT NULL DEFAULT false,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);

CREATE TABLE schedules (
    id           UUID    PRIMARY KEY,          -- UUIDv7: creation-ordered
    tenant_id    BIGINT  NOT NULL,
    version      INTEGER NOT NULL,
    state        TEXT    NOT NULL,             -- ACTIVE | PAUSED | CANCELED
    shard        INTEGER NOT NULL,
    next_run_at  BIGINT,
    fires_per_hour INTEGER NOT NULL DEFAULT 0,
    created_at   BIGINT  NOT NULL,
    updated_at   BIGINT  NOT NULL
);

-- The planner's queue: one entry per ACTIVE schedule with an instant left to plan, keyed by
-- shard and next_run_at. A planning pass only touches the front of each shard's queue (it
-- deletes the entries it planned and inserts them again further back), so its cost follows
-- the number of schedules due, not the number stored: no random row of `schedules` is
-- written per pass. `schedules.next_run_at` is only a snapshot taken at lifecycle changes
-- (and where a paused schedule resumes from); the queue is authoritative while active.
CREATE TABLE schedule_queue (
    shard        INTEGER NOT NULL,
    next_run_at  BIGINT NOT NULL,
    schedule_id  UUID NOT NULL,
    version      INTEGER NOT NULL,      -- the version that will plan it: the fence of a pass
    tenant_id    BIGINT NOT NULL,
    PRIMARY KEY (shard, next_run_at, schedule_id)
);
CREATE INDEX schedules_tenant ON schedules (tenant_id, id);

CREATE TABLE schedule_versions (
    schedule_id         UUID    NOT NULL,
    version             INTEGER NOT NULL,
    kind                TEXT    NOT NULL,
    cron                TEXT,
    timezone            TEXT,
    dst_gap             TEXT,
    dst_fold            TEXT,
    at                  BIGINT,
    every_ms            BIGINT,
    anchor              BIGINT,
    queue               TEXT    NOT NULL,
    payload             TEXT,
    priority            INTEGER NOT NULL,
    lease_ms            BIGINT  NOT NULL,
    max_attempts        INTEGER NOT NULL,
    backoff_initial_ms  BIGINT  NOT NULL,
    backoff_max_ms      BIGINT  NOT NULL,
    misfire             TEXT    NOT NULL,
    overlap             TEXT    NOT NULL,
    flex_window_ms      BIGINT  NOT NULL,
    created_at          BIGINT  NOT NULL,
    PRIMARY KEY (schedule_id, version)
);

-- See the SQLite schema for the reasoning: time-major keys, stored READY covers SCHEDULED.
CREATE TABLE occurrences (
    seq                 BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                  UUID    NOT NULL UNIQUE,
    tenant_id           BIGINT  NOT NULL,
    schedule_id         UUID    NOT NULL,
    version             INTEGER NOT NULL,
    scheduled_for       BIGINT  NOT NULL,
    available_at        BIGINT  NOT NULL,
    queue               TEXT    NOT NULL,
    priority            INTEGER NOT NULL,
    state               TEXT    NOT NULL,
    epoch               BIGINT  NOT NULL DEFAULT 0,
    owner               TEXT,
    lease_until         BIGINT,
    claimed_at          BIGINT,
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL,
    backoff_initial_ms  BIGINT  NOT NULL,
    backoff_max_ms      BIGINT  NOT NULL,
    overlap             INTEGER NOT NULL DEFAULT 0,   -- 0 ALLOW, 1 SKIP_IF_RUNNING, 2 QUEUE_ONE
    cancel_requested    BOOLEAN NOT NULL DEFAULT false,
    result              TEXT,
    last_error_class    TEXT,
    last_error          TEXT,
    created_at          BIGINT  NOT NULL,
    finished_at         BIGINT,
    UNIQUE (scheduled_for, schedule_id, version)
) WITH (fillfactor = 80);   -- room for HOT updates as states change
CREATE INDEX occurrences_pending ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT');
CREATE INDEX occurrences_running_queue ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING';
CREATE INDEX occurrences_running ON occurrences (lease_until) WHERE state = 'RUNNING';
CREATE INDEX occurrences_schedule ON occurrences (schedule_id, scheduled_for);
-- "Is another occurrence of this schedule running?", asked only for overlap-constrained
-- schedules, so the index holds nothing for the default ALLOW.
CREATE INDEX occurrences_running_schedule ON occurrences (schedule_id)
    WHERE state = 'RUNNING' AND overlap <> 0;

-- Very long misfire gaps, summarized: one row with a count and a range instead of a MISSED
-- occurrence per instant. `count_exact` is false when the gap was too long to enumerate.
CREATE TABLE missed_ranges (
    tenant_id     BIGINT NOT NULL,
    schedule_id   UUID NOT NULL,
    version       INTEGER NOT NULL,
    first_at      BIGINT NOT NULL,
    last_at       BIGINT NOT NULL,
    count         BIGINT NOT NULL,
    count_exact   BOOLEAN NOT NULL,
    recorded_at   BIGINT NOT NULL,
    PRIMARY KEY (schedule_id, version, first_at)
);

CREATE TABLE attempts (
    occurrence_seq  BIGINT NOT NULL,
    epoch           BIGINT NOT NULL,
    owner           TEXT   NOT NULL,
    started_at      BIGINT NOT NULL,
    lease_until     BIGINT NOT NULL,
    finished_at     BIGINT,
    outcome         TEXT   NOT NULL,
    error_class     TEXT,
    error_message   TEXT,
    PRIMARY KEY (occurrence_seq, epoch)
);

CREATE TABLE outbox (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id       BIGINT NOT NULL,
    occurrence_id   UUID   NOT NULL,
    target          TEXT   NOT NULL,
    payload         TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE delivered_at IS NULL;

CREATE TABLE shard_leases (
    shard        INTEGER PRIMARY KEY,
    owner        TEXT,
    epoch        BIGINT NOT NULL DEFAULT 0,
    lease_until  BIGINT
);

-- Planner nodes seen recently, so a node holding no shard still counts for the fair share.
CREATE TABLE planner_nodes (
    node         TEXT PRIMARY KEY,
    alive_until  BIGINT NOT NULL
);

-- Per-queue concurrency limits: at most max_running occurrences of a tenant's queue RUNNING at
-- once, across all workers and nodes (claims count and take under one lock).
CREATE TABLE queue_limits (
    tenant_id    BIGINT NOT NULL,
    queue        TEXT NOT NULL,
    max_running  BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, queue)
);

CREATE TABLE idempotency_keys (
    tenant_id     BIGINT NOT NULL,
    key           TEXT   NOT NULL,
    request_hash  BYTEA  NOT NULL,
    status        INTEGER,
    response      TEXT,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
