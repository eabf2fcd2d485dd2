-- Occurrences partitioned by UTC day of their planned instant, so that retention drops a whole
-- day instead of deleting its rows (docs/DESIGN.md, "Why are occurrences partitioned by day on
-- PostgreSQL?").
--
-- The partition key is the id: an occurrence id leads with its planned instant's milliseconds
-- (`campanile_core::occurrence_id`, 48 bits big-endian), so a range of ids is a range of
-- planned instants, and every statement that names an occurrence by id reads one partition.
-- A unique constraint of a partitioned table must hold its partition key, so the key
-- `(schedule_id, scheduled_for, version)` is a unique index of each partition: the check
-- `occurrences_id_leads_with_instant` puts every row of one planned instant in the same
-- partition, where that index sees it. (Rows written before ids led with their instant
-- keep their ids; they land in the default partition, with the instants of days that have no
-- partition of their own.) `seq` keeps its sequence, without a unique constraint
-- (the sequence alone hands its values out). A trigger's idempotency key moves to its own
-- table, `occurrence_triggers`.
--
-- What this database held moves into the default partition, except the days from yesterday
-- on, which get partitions of their own; the default partition also takes instants of days
-- that have none (a backfill into a dropped day, or what a dropped day kept). Nodes create the
-- next days' partitions ahead (`campanile_occurrence_day`).

ALTER TABLE occurrences RENAME TO occurrences_unpartitioned;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE i.indrelid = 'occurrences_unpartitioned'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.relname, 'unpartitioned_' || r.relname);
    END LOOP;
END $$;

CREATE SEQUENCE occurrences_seq;
SELECT setval('occurrences_seq', COALESCE((SELECT max(seq) FROM occurrences_unpartitioned), 0) + 1,
              false);

CREATE TABLE occurrences (
    seq                 BIGINT  NOT NULL DEFAULT nextval('occurrences_seq'),
    id                  UUID    NOT NULL,
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
    overlap             INTEGER NOT NULL DEFAULT 0,
    cancel_requested    BOOLEAN NOT NULL DEFAULT false,
    result              TEXT,
    last_error_class    TEXT,
    last_error          TEXT,
    created_at          BIGINT  NOT NULL,
    finished_at         BIGINT,
    lease_ms            BIGINT  NOT NULL DEFAULT 30000,
    due_at              BIGINT,
    ran_until           BIGINT,
    claim_key           UUID,
    origin              TEXT,
    trigger_key         TEXT,
    payload             TEXT,
    CONSTRAINT occurrences_id_key UNIQUE (id)
) PARTITION BY RANGE (id);
ALTER SEQUENCE occurrences_seq OWNED BY occurrences.seq;
-- Every id leads with its planned instant, but for the rows of databases written before ids
-- did (they all precede this migration: the rows up to its highest seq).
DO $$
BEGIN
    EXECUTE format(
        'ALTER TABLE occurrences ADD CONSTRAINT occurrences_id_leads_with_instant
             CHECK (seq <= %s OR substring(uuid_send(id) FROM 1 FOR 6)
                                   = substring(int8send(scheduled_for) FROM 3 FOR 6))',
        COALESCE((SELECT max(seq) FROM occurrences_unpartitioned), 0));
END $$;

CREATE INDEX occurrences_by_seq ON occurrences (seq);
CREATE INDEX occurrences_pending ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT');
CREATE INDEX occurrences_pending_constrained ON occurrences (tenant_id, queue, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
CREATE INDEX occurrences_pending_constrained_schedule
    ON occurrences (schedule_id, priority DESC, available_at, seq)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
CREATE INDEX occurrences_ran_constrained_schedule ON occurrences (schedule_id, ran_until)
    WHERE overlap <> 0 AND ran_until IS NOT NULL;
CREATE INDEX occurrences_running ON occurrences (lease_until) WHERE state = 'RUNNING';
CREATE INDEX occurrences_running_constrained ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING' AND overlap <> 0;
CREATE INDEX occurrences_running_queue ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING';
CREATE INDEX occurrences_running_schedule ON occurrences (schedule_id)
    WHERE state = 'RUNNING' AND overlap <> 0;

CREATE TABLE occurrences_default PARTITION OF occurrences DEFAULT WITH (fillfactor = 80);
CREATE UNIQUE INDEX occurrences_default_key
    ON occurrences_default (schedule_id, scheduled_for, version);

-- Refuses any change to a row of a day retention has sealed: what it archives is what it
-- drops (`retention_days`).
CREATE FUNCTION campanile_sealed_day() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'occurrence % is in a day that retention is archiving; it cannot change',
        CASE WHEN TG_OP = 'INSERT' THEN NEW.id ELSE OLD.id END
        USING ERRCODE = 'object_not_in_prerequisite_state';
END $$;

-- The partition of the UTC day starting at `day_start` (Unix ms), created if missing: its
-- id range, the key as its unique index, and the rows the default partition held for that day
-- moved into it, in one transaction. Returns its name.
CREATE FUNCTION campanile_occurrence_day(day_start BIGINT) RETURNS TEXT LANGUAGE plpgsql AS $$
DECLARE
    name TEXT := 'occurrences_' || to_char(to_timestamp(day_start / 1000.0) AT TIME ZONE 'UTC',
                                           'YYYYMMDD');
    lo UUID := (lpad(to_hex(day_start), 12, '0') || repeat('0', 20))::uuid;
    hi UUID := (lpad(to_hex(day_start + 86400000), 12, '0') || repeat('0', 20))::uuid;
BEGIN
    IF day_start % 86400000 <> 0 OR day_start < 0 THEN
        RAISE EXCEPTION 'not the start of a UTC day: %', day_start;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'occurrences'::regclass AND c.relname = name) THEN
        RETURN name;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE occurrences INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
                    WITH (fillfactor = 80)', name);
    -- Implies the partition's bounds, so attaching it does not scan it.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (id >= %L AND id < %L)',
                   name, name || '_range', lo, hi);
    EXECUTE format('CREATE UNIQUE INDEX %I ON %I (schedule_id, scheduled_for, version)',
                   name || '_key', name);
    EXECUTE format('WITH moved AS (DELETE FROM occurrences_default WHERE id >= %L AND id < %L
                    RETURNING *) INSERT INTO %I SELECT * FROM moved', lo, hi, name);
    EXECUTE format('ALTER TABLE occurrences ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   name, lo, hi);
    RETURN name;
END $$;

-- Yesterday's, today's and the next three days' partitions, before the rows come in.
SELECT campanile_occurrence_day(d)
  FROM generate_series(
         ((extract(epoch FROM now()) * 1000)::bigint / 86400000 - 1) * 86400000,
         ((extract(epoch FROM now()) * 1000)::bigint / 86400000 + 3) * 86400000,
         86400000) AS d;

INSERT INTO occurrences SELECT * FROM occurrences_unpartitioned;

CREATE TABLE occurrence_triggers (
    schedule_id    UUID NOT NULL,
    trigger_key    TEXT NOT NULL,
    occurrence_id  UUID NOT NULL,
    PRIMARY KEY (schedule_id, trigger_key)
);
INSERT INTO occurrence_triggers (schedule_id, trigger_key, occurrence_id)
SELECT schedule_id, trigger_key, id FROM occurrences_unpartitioned WHERE trigger_key IS NOT NULL;

DROP TABLE occurrences_unpartitioned;

-- Days retention is taking out as a whole (docs/DESIGN.md): sealed (its partition refuses
-- changes), then archived, then detached and dropped. `survivors` are the rows that stay (they
-- move to the default partition), `rollups` what the day adds to `occurrence_rollups`, and
-- `max_seq` the day's newest row when they were decided: a row planned into the day later
-- makes the day be decided again.
CREATE TABLE retention_days (
    name        TEXT PRIMARY KEY,
    day         BIGINT NOT NULL UNIQUE,
    lo          UUID NOT NULL,
    hi          UUID NOT NULL,
    state       TEXT NOT NULL,          -- sealed | decided | detached
    sealed_at   BIGINT NOT NULL,
    owner       TEXT,
    lease_until BIGINT,
    survivors   UUID[],
    rollups     JSONB,
    max_seq     BIGINT,
    archived    BIGINT
);
