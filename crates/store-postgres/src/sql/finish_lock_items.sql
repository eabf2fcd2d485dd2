-- name: FINISH_LOCK_ITEMS
-- The fencing columns of a batch's occurrences (`$2`) and whether each is asked to cancel, locked in seq order.
SELECT seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts,
backoff_initial_ms, backoff_max_ms, cancel_requested FROM occurrences WHERE tenant_id = $1 AND id = ANY($2) ORDER BY seq FOR UPDATE
