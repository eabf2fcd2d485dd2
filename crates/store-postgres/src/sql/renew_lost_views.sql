-- name: RENEW_LOST_VIEWS
-- The fencing columns of the occurrences (`$2`) whose renewal was refused.
SELECT seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
backoff_initial_ms, backoff_max_ms FROM occurrences WHERE tenant_id = $1 AND id = ANY($2)
