-- Overlap-constrained work (SKIP_IF_RUNNING, QUEUE_ONE) in indexes of its own, as on SQLite:
-- the worker claim asks "is any of it due, pending or under an expired lease?" in the same
-- statement as the claim, with a seek in each, and runs the constrained pass (a transaction of
-- its own) only when the answer is yes. Both indexes hold nothing for the default ALLOW.
CREATE INDEX occurrences_pending_constrained
    ON occurrences (tenant_id, queue, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
CREATE INDEX occurrences_running_constrained
    ON occurrences (tenant_id, queue, lease_until)
    WHERE state = 'RUNNING' AND overlap <> 0;
