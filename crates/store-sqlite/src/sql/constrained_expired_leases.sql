-- name: CONSTRAINED_EXPIRED_LEASES
-- Expired leases with attempts left at `?3` in a queue (`?1` tenant, `?2` queue), up to `?4`, in `candidate` order: overlap-constrained occurrences.
SELECT priority, overlap, state = 'RUNNING', seq, id, schedule_id, version, scheduled_for, available_at, epoch, attempts, lease_ms, lease_until FROM occurrences
WHERE tenant_id = ?1 AND queue = ?2 AND state = 'RUNNING' AND lease_until <= ?3
  AND attempts < max_attempts AND cancel_requested = 0 AND overlap <> 0
ORDER BY lease_until LIMIT ?4
