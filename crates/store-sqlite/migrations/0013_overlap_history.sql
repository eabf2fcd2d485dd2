-- Overlap policies are decided from what the schedule's other runs did when a candidate came
-- due, not only from their state when a claim looks at it: "had another been claimed by then,
-- and was it still running then?" and "was one ahead of it claimed only later?". A run that
-- is not running now answers both by its finish instant (it finished after the candidate
-- came due): a range of the schedule's constrained runs by finish instant, short (the runs
-- since then). The index holds nothing for the default ALLOW, nor for occurrences never
-- claimed (skipped, missed, canceled before running).
CREATE INDEX occurrences_finished_constrained_schedule
    ON occurrences (schedule_id, finished_at)
    WHERE overlap <> 0 AND claimed_at IS NOT NULL;
-- "Was one ahead of it in claim order pending when it came due, or is it now?": a seek in the
-- schedule's pending constrained occurrences, in claim order (PostgreSQL has had this one
-- since its migration 12; SQLite's claims kept "waiting ahead" in memory until now).
CREATE INDEX occurrences_pending_constrained_schedule
    ON occurrences (schedule_id, priority DESC, available_at, seq)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
