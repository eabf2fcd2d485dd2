-- The planner's queue carries what planning needs of the version that will plan it (all of the
-- version but its payload), so that a planning pass reads the front of the queue and nothing
-- else. Looking each due entry's version up in `schedule_versions` cost a random page per due
-- schedule there, in a table that grows with every schedule stored: with 2M schedules stored
-- and this machine's 128 MB of shared buffers, a third of a 10k-due pass's reads (docs/DESIGN.md,
-- "Why does the planner's queue carry each schedule's definition (PostgreSQL)?"). The copy is written where
-- an entry is written (create, update, resume, and the planning pass that moves it back),
-- always from the version row it names, and a version row never changes.
ALTER TABLE schedule_queue
    ADD COLUMN kind               TEXT,
    ADD COLUMN cron               TEXT,
    ADD COLUMN timezone           TEXT,
    ADD COLUMN dst_gap            TEXT,
    ADD COLUMN dst_fold           TEXT,
    ADD COLUMN at                 BIGINT,
    ADD COLUMN every_ms           BIGINT,
    ADD COLUMN anchor             BIGINT,
    ADD COLUMN queue              TEXT,
    ADD COLUMN priority           INTEGER,
    ADD COLUMN lease_ms           BIGINT,
    ADD COLUMN max_attempts       INTEGER,
    ADD COLUMN backoff_initial_ms BIGINT,
    ADD COLUMN backoff_max_ms     BIGINT,
    ADD COLUMN misfire            TEXT,
    ADD COLUMN overlap            TEXT,
    ADD COLUMN flex_window_ms     BIGINT;

UPDATE schedule_queue q
   SET kind = v.kind, cron = v.cron, timezone = v.timezone, dst_gap = v.dst_gap,
       dst_fold = v.dst_fold, at = v.at, every_ms = v.every_ms, anchor = v.anchor,
       queue = v.queue, priority = v.priority, lease_ms = v.lease_ms,
       max_attempts = v.max_attempts, backoff_initial_ms = v.backoff_initial_ms,
       backoff_max_ms = v.backoff_max_ms, misfire = v.misfire, overlap = v.overlap,
       flex_window_ms = v.flex_window_ms
  FROM schedule_versions v
 WHERE v.schedule_id = q.schedule_id AND v.version = q.version;

-- An entry without its version row could not be planned before this migration either (the
-- lookup found nothing); failing here names the schedule instead of carrying the problem on.
DO $$
DECLARE
    orphan UUID;
BEGIN
    SELECT schedule_id INTO orphan FROM schedule_queue WHERE kind IS NULL LIMIT 1;
    IF orphan IS NOT NULL THEN
        RAISE EXCEPTION 'the planning queue names a version of schedule % that does not exist', orphan;
    END IF;
END
$$;

ALTER TABLE schedule_queue
    ALTER COLUMN kind SET NOT NULL,
    ALTER COLUMN queue SET NOT NULL,
    ALTER COLUMN priority SET NOT NULL,
    ALTER COLUMN lease_ms SET NOT NULL,
    ALTER COLUMN max_attempts SET NOT NULL,
    ALTER COLUMN backoff_initial_ms SET NOT NULL,
    ALTER COLUMN backoff_max_ms SET NOT NULL,
    ALTER COLUMN misfire SET NOT NULL,
    ALTER COLUMN overlap SET NOT NULL,
    ALTER COLUMN flex_window_ms SET NOT NULL;
