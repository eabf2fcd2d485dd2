-- Campanile schema v1 (SQLite). Instants are INTEGER Unix milliseconds; ids are 16-byte BLOBs.

CREATE TABLE tenants (
    id                    INTEGER PRIMARY KEY,
    name                  TEXT    NOT NULL UNIQUE,
    created_at            INTEGER NOT NULL,
    max_active_schedules  INTEGER,
    max_triggers_per_sec  INTEGER,
    max_running           INTEGER,
    max_catchup_per_sec   INTEGER
);

-- API keys are stored hashed; `prefix` is the first characters, to tell keys apart in lists.
-- Admin keys (tenant management) have no tenant.
CREATE TABLE api_keys (
    id          INTEGER PRIMARY KEY,
    tenant_id   INTEGER REFERENCES tenants(id),
    key_hash    BLOB    NOT NULL UNIQUE,
    prefix      TEXT    NOT NULL,
    is_admin    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

-- One row per schedule: only what the planner scans. The definition lives in versions.
CREATE TABLE schedules (
    id           BLOB    PRIMARY KEY,          -- UUIDv7: creation-ordered
    tenant_id    INTEGER NOT NULL,
    version      INTEGER NOT NULL,
    state        TEXT    NOT NULL,             -- ACTIVE | PAUSED | CANCELED
    shard        INTEGER NOT NULL,
    next_run_at  INTEGER,                      -- snapshot; see schedule_queue
    fires_per_hour INTEGER NOT NULL DEFAULT 0, -- for the tenant's trigger-rate quota
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) WITHOUT ROWID;

-- The planner's queue: one entry per ACTIVE schedule with an instant left to plan, keyed by
-- shard and next_run_at. A planning pass only touches the front of each shard's queue (it
-- deletes the entries it planned and inserts them again further back), so its cost follows
-- the number of schedules due, not the number stored: no random row of `schedules` is
-- written per pass. `schedules.next_run_at` is only a snapshot taken at lifecycle changes
-- (and where a paused schedule resumes from); the queue is authoritative while active.
CREATE TABLE schedule_queue (
    shard        INTEGER NOT NULL,
    next_run_at  INTEGER NOT NULL,
    schedule_id  BLOB NOT NULL,
    version      INTEGER NOT NULL,      -- the version that will plan it: the fence of a pass
    tenant_id    INTEGER NOT NULL,
    PRIMARY KEY (shard, next_run_at, schedule_id)
) WITHOUT ROWID;
CREATE INDEX schedules_tenant ON schedules (tenant_id, id);

CREATE TABLE schedule_versions (
    schedule_id         BLOB    NOT NULL,
    version             INTEGER NOT NULL,
    kind                TEXT    NOT NULL,      -- cron | at | every
    cron                TEXT,
    timezone            TEXT,
    dst_gap             TEXT,
    dst_fold            TEXT,
    at                  INTEGER,
    every_ms            INTEGER,
    anchor              INTEGER,
    queue               TEXT    NOT NULL,
    payload             TEXT,
    priority            INTEGER NOT NULL,
    lease_ms            INTEGER NOT NULL,
    max_attempts        INTEGER NOT NULL,
    backoff_initial_ms  INTEGER NOT NULL,
    backoff_max_ms      INTEGER NOT NULL,
    misfire             TEXT    NOT NULL,
    overlap             TEXT    NOT NULL,
    flex_window_ms      INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, version)
);

-- Occurrences. `seq` and `id` grow with planned time, and so does the unique key, which is
-- time-major on purpose: the planner inserts in time order, so these indexes grow at their end.
-- Stored `state` READY covers SCHEDULED (not yet due); readers report SCHEDULED when
-- available_at > now, and RETRY_WAIT rows whose backoff passed as READY. That saves a write
-- per occurrence on the hot path.
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
    UNIQUE (scheduled_for, schedule_id, version)
);
-- The claim scan: due pending work of one tenant's queue, by priority then availability.
CREATE INDEX occurrences_pending ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT');
-- Expired leases, by queue for claims. The sweep scans this whole index: it only holds
-- occurrences in flight, and one index fewer on the hot path was worth ~8% of throughput.
CREATE INDEX occurrences_running ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING';
-- Listing by schedule. Schedule-major, so it is the one index that is not append-mostly.
CREATE INDEX occurrences_schedule ON occurrences (schedule_id, scheduled_for);
-- "Is another occurrence of this schedule running?", asked only for overlap-constrained
-- schedules, so the index holds nothing for the default ALLOW.
CREATE INDEX occurrences_running_schedule ON occurrences (schedule_id)
    WHERE state = 'RUNNING' AND overlap <> 0;

-- Very long misfire gaps, summarized: one row with a count and a range instead of a MISSED
-- occurrence per instant. `count_exact` is false when the gap was too long to enumerate.
CREATE TABLE missed_ranges (
    tenant_id     INTEGER NOT NULL,
    schedule_id   BLOB NOT NULL,
    version       INTEGER NOT NULL,
    first_at      INTEGER NOT NULL,
    last_at       INTEGER NOT NULL,
    count         INTEGER NOT NULL,
    count_exact   INTEGER NOT NULL,
    recorded_at   INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, version, first_at)
);

-- One row per claim.
CREATE TABLE attempts (
    occurrence_seq  INTEGER NOT NULL,
    epoch           INTEGER NOT NULL,
    owner           TEXT    NOT NULL,
    started_at      INTEGER NOT NULL,
    lease_until     INTEGER NOT NULL,
    finished_at     INTEGER,
    outcome         TEXT    NOT NULL,          -- running | succeeded | failed | lease_expired
    error_class     TEXT,
    error_message   TEXT,
    PRIMARY KEY (occurrence_seq, epoch)
) WITHOUT ROWID;

-- Transactional outbox for external targets (NATS JetStream first).
CREATE TABLE outbox (
    seq             INTEGER PRIMARY KEY,
    tenant_id       INTEGER NOT NULL,
    occurrence_id   BLOB    NOT NULL,
    target          TEXT    NOT NULL,
    payload         TEXT,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT
);
CREATE INDEX outbox_pending ON outbox (seq) WHERE delivered_at IS NULL;

-- Planner shard leases, fenced by epoch like occurrence leases.
CREATE TABLE shard_leases (
    shard        INTEGER PRIMARY KEY,
    owner        TEXT,
    epoch        INTEGER NOT NULL DEFAULT 0,
    lease_until  INTEGER
);

-- Planner nodes seen recently, so a node holding no shard still counts for the fair share.
CREATE TABLE planner_nodes (
    node         TEXT PRIMARY KEY,
    alive_until  INTEGER NOT NULL
);

-- Per-queue concurrency limits: at most max_running occurrences of a tenant's queue RUNNING at
-- once, across all workers and nodes (claims count and take under one lock).
CREATE TABLE queue_limits (
    tenant_id    INTEGER NOT NULL,
    queue        TEXT NOT NULL,
    max_running  INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, queue)
);

CREATE TABLE idempotency_keys (
    tenant_id     INTEGER NOT NULL,
    key           TEXT    NOT NULL,
    request_hash  BLOB    NOT NULL,
    status        INTEGER,
    response      TEXT,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
) WITHOUT ROWID;
