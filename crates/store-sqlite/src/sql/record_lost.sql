-- name: RECORD_LOST
-- [`RECORD_ATTEMPT`] for those of the occurrences `?5` (a JSON array of seqs) still running.
INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at,
                      outcome, error_class, error_message)
SELECT seq, epoch, owner, claimed_at, lease_until, ?2, ?1, ?3, ?4 FROM occurrences WHERE seq IN (SELECT value FROM json_each(?5)) AND state = 'RUNNING'
    ON CONFLICT (occurrence_seq, epoch) DO UPDATE
   SET finished_at = excluded.finished_at, outcome = excluded.outcome,
       lease_until = excluded.lease_until, error_class = excluded.error_class,
       error_message = excluded.error_message
 WHERE attempts.outcome = 'running'
