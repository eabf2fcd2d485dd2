-- name: CONSTRAINED_PENDING_DUE_RANGE
-- The due range of pending priority `?3` at `?4` of a queue (`?1` tenant, `?2` queue), up to `?5`, in `candidate` order: overlap-constrained occurrences.
SELECT priority, overlap, state = 'RUNNING', seq, id, schedule_id, version, scheduled_for, available_at, epoch, attempts, lease_ms, lease_until FROM occurrences
WHERE tenant_id = ?1 AND queue = ?2 AND state IN ('READY', 'RETRY_WAIT')
  AND overlap <> 0 AND priority = ?3 AND available_at <= ?4
ORDER BY available_at LIMIT ?5
