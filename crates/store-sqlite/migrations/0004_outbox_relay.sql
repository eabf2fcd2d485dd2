-- The relay reads the outbox across tenants by due time; the outbox row is written in the
-- planner's transaction with its occurrence (one row per occurrence, whatever the retries),
-- and settled when the occurrence has ended: delivered (SUCCEEDED) or closed otherwise
-- (DEAD, CANCELED). Nothing is deleted.
DROP INDEX outbox_pending;
ALTER TABLE outbox ADD COLUMN available_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox ADD COLUMN settled_at INTEGER;
ALTER TABLE outbox ADD COLUMN outcome TEXT;
UPDATE outbox SET settled_at = delivered_at, outcome = 'SUCCEEDED' WHERE delivered_at IS NOT NULL;
CREATE UNIQUE INDEX outbox_occurrence ON outbox (occurrence_id);
CREATE INDEX outbox_due ON outbox (available_at) WHERE settled_at IS NULL;
