-- name: RELAY_DUE
-- The relay's due outbox rows with their occurrences, locked: `$1` now, `$2` how many, `$3`
-- the caller's instant or NULL (for the liveness gate). The occurrence's columns first, in
-- order `fence_view` reads. Nothing while no node is live: the relay is a node's
-- own and waits, as its node's claims do.
SELECT occ.seq, occ.id, occ.state, occ.owner, occ.epoch, occ.lease_until, occ.available_at,
      occ.attempts, occ.max_attempts, occ.backoff_initial_ms, occ.backoff_max_ms,
      o.seq, o.tenant_id, o.target
 FROM outbox o JOIN occurrences occ ON occ.id = o.occurrence_id
WHERE o.settled_at IS NULL AND o.available_at <= $1
  AND NOT (occ.state = 'RUNNING' AND occ.cancel_requested) AND (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > COALESCE($3::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8), TRUE))
ORDER BY o.available_at LIMIT $2
FOR UPDATE OF o, occ SKIP LOCKED
