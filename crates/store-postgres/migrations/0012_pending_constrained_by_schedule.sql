-- "Is an occurrence of this schedule already waiting ahead of this one?", asked by the
-- constrained claim for each candidate with the schedule's row locked: a seek in the schedule's
-- pending constrained occurrences, in claim order. Holds nothing for the default ALLOW.
CREATE INDEX occurrences_pending_constrained_schedule
    ON occurrences (schedule_id, priority DESC, available_at, seq)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
