-- Where an occurrence came from: NULL for one the planner planned from the calendar,
-- 'manual' for one an operator triggered (`POST /v1/schedules/{id}/trigger`), which
-- `campanile reconcile` does not expect from the calendar. `trigger_key` is the trigger's
-- `Idempotency-Key`: a trigger sent again with it answers the occurrence it made.
ALTER TABLE occurrences ADD COLUMN origin TEXT;
ALTER TABLE occurrences ADD COLUMN trigger_key TEXT;
CREATE UNIQUE INDEX occurrences_trigger_key ON occurrences (schedule_id, trigger_key)
    WHERE trigger_key IS NOT NULL;
