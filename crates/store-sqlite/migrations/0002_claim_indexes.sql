-- Claims walk the pending index one priority at a time (a loose index scan), so that a poll
-- finding nothing due costs a few seeks however many future occurrences wait in the queue.
-- Unconstrained (overlap ALLOW) and constrained occurrences get separate partial indexes, so the
-- fast path never has to look at a row to check its overlap policy.
DROP INDEX occurrences_pending;
CREATE INDEX occurrences_pending ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0;
CREATE INDEX occurrences_pending_constrained
    ON occurrences (tenant_id, queue, priority DESC, available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap <> 0;
