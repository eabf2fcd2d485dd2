-- name: LEASE_SWEEP
-- Expired leases, oldest first, at most `$2` at `$1`: `CANCELED` if their cancellation was
-- requested while they ran, else back to `READY` with attempts left, else `DEAD`; each lost
-- attempt recorded. Answers how many of each (requeued, dead, canceled).
WITH exp AS (
       SELECT seq, id, epoch, owner, claimed_at, lease_until, attempts >= max_attempts AS dead,
              cancel_requested AS canceled FROM occurrences
        WHERE state = 'RUNNING' AND lease_until <= $1
        ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED),
   upd AS (
       UPDATE occurrences o
          SET state = CASE WHEN exp.canceled THEN 'CANCELED' WHEN exp.dead THEN 'DEAD' ELSE 'READY' END,
              finished_at = CASE WHEN exp.canceled OR exp.dead THEN $1 ELSE o.finished_at END,
              available_at = CASE WHEN exp.canceled OR exp.dead THEN o.available_at
                                  ELSE GREATEST(o.available_at, exp.lease_until) END,
              last_error = 'lease expired', ran_until = exp.lease_until
         FROM exp WHERE o.id = exp.id AND o.seq = exp.seq
       RETURNING exp.dead, exp.canceled),
   att AS (
       INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
       SELECT seq, epoch, owner, claimed_at, lease_until, $1, 'lease_expired' FROM exp
       ON CONFLICT (occurrence_seq, epoch) DO UPDATE
  SET finished_at = excluded.finished_at, outcome = excluded.outcome,
      lease_until = excluded.lease_until, error_class = excluded.error_class,
      error_message = excluded.error_message
WHERE attempts.outcome = 'running')
   SELECT count(*) FILTER (WHERE NOT dead AND NOT canceled),
          count(*) FILTER (WHERE dead AND NOT canceled), count(*) FILTER (WHERE canceled) FROM upd
