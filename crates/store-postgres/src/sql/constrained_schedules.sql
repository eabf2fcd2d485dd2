-- name: CONSTRAINED_SCHEDULES
-- The schedules of a claim's overlap-constrained candidates, read without locking (`$4` how
-- many candidates), so that their rows can be locked first, in id order.
SELECT schedule_id FROM occurrences WHERE tenant_id = $1 AND queue = $2 AND overlap <> 0
  AND ((state IN ('READY', 'RETRY_WAIT') AND available_at <= $3)
       OR (state = 'RUNNING' AND lease_until <= $3 AND attempts < max_attempts
           AND NOT cancel_requested))
  AND (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > COALESCE($5::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8), TRUE))
ORDER BY priority DESC, CASE WHEN state = 'RUNNING' THEN GREATEST(available_at, lease_until) ELSE available_at END, seq LIMIT $4
