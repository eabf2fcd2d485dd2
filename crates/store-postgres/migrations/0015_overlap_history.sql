-- Overlap policies are decided from what the schedule's other runs did when a candidate came
-- due, not only from their state when a claim looks at it: "had another been claimed by then,
-- and was it still running then?" and "had one ahead of it come due and not been claimed
-- yet?". Two instants the rows did not keep:
-- - `due_at`: when the occurrence first came due (its first `available_at`; retries, catch-up
--   and lease takeovers move `available_at` later). Written for overlap-constrained rows
--   only; read as COALESCE(due_at, available_at).
-- - `ran_until`: when its latest attempt that ran ended (reported, or its lease ended), so
--   that [claimed_at, ran_until] is that attempt's run. Skips, cancels and misses of rows that
--   never ran again leave it alone (`finished_at` is not a run's end: a retry waiting to run
--   that is then skipped gets one).
-- Rows from before this migration: successes of constrained schedules that ended in the last
-- day get `ran_until` from `finished_at` (exact for them; older runs cannot span the due
-- instant of anything still waiting, and writing them would only cost); the other history
-- counts from now on.
ALTER TABLE occurrences ADD COLUMN due_at BIGINT;
ALTER TABLE occurrences ADD COLUMN ran_until BIGINT;
UPDATE occurrences SET ran_until = finished_at
 WHERE overlap <> 0 AND state = 'SUCCEEDED' AND claimed_at IS NOT NULL
   AND finished_at > (extract(epoch FROM now()) * 1000)::bigint - 86400000;
-- The schedule's runs that ended after a candidate came due: a short range (the runs since
-- then). Holds nothing for the default ALLOW.
CREATE INDEX occurrences_ran_constrained_schedule
    ON occurrences (schedule_id, ran_until)
    WHERE overlap <> 0 AND ran_until IS NOT NULL;
