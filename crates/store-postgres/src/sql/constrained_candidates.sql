-- name: CONSTRAINED_CANDIDATES
-- The candidates themselves, locked, of the schedules locked (`$6`), with their payloads'
-- sizes in bytes, and their ids.
SELECT seq, schedule_id, overlap, state, available_at, priority,
      COALESCE(octet_length(payload),
               (SELECT octet_length(v.payload) FROM schedule_versions v
                 WHERE v.schedule_id = occurrences.schedule_id AND v.version = occurrences.version)),
      id
 FROM occurrences
WHERE tenant_id = $1 AND queue = $2 AND overlap <> 0
  AND ((state IN ('READY', 'RETRY_WAIT') AND available_at <= $3)
       OR (state = 'RUNNING' AND lease_until <= $3 AND attempts < max_attempts
           AND NOT cancel_requested))
  AND (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > COALESCE($5::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8), TRUE)) AND schedule_id = ANY($6::uuid[])
ORDER BY priority DESC, CASE WHEN state = 'RUNNING' THEN GREATEST(available_at, lease_until) ELSE available_at END, seq LIMIT $4
FOR UPDATE SKIP LOCKED
