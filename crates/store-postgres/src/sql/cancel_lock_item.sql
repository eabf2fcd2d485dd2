-- name: CANCEL_LOCK_ITEM
-- The fencing columns of a tenant's occurrence (`$2`), locked, for a cancel.
SELECT seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
backoff_initial_ms, backoff_max_ms FROM occurrences WHERE tenant_id = $1 AND id = $2 FOR UPDATE
