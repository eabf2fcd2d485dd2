-- name: OCCURRENCE_BY_PLANNED
-- A tenant's occurrence by its planned instant (`?1`) and schedule (`?2`; `?3` the tenant): the latest version's.
SELECT seq, id, schedule_id, version, scheduled_for, available_at, queue, priority, state,
epoch, owner, lease_until, attempts, max_attempts, cancel_requested, result, last_error_class,
last_error, finished_at, claimed_at, origin, payload FROM occurrences
              WHERE scheduled_for = ?1 AND schedule_id = ?2 AND tenant_id = ?3
              ORDER BY version DESC LIMIT 1
