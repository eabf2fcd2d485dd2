-- name: OCCURRENCE_BY_ID
-- A tenant's occurrence by id (`?1` the id, `?2` the tenant) with its claim instant.
SELECT seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
last_error, finished_at, claimed_at, origin, payload FROM occurrences WHERE id = ?1 AND tenant_id = ?2
