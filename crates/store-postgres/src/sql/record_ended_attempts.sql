-- name: RECORD_ENDED_ATTEMPTS
-- Attempt rows for the attempts a batch ended otherwise than in success, from the occurrence
-- rows just written: `$1` seqs, `$2` epochs, `$3` outcomes, `$4` now, `$5`/`$6` error class
-- and message, `$7` the seqs written, `$8` the ids (in the order of `$1`: an occurrence is
-- found by its id, the partitioned table's unique key).
INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at,
                         outcome, error_class, error_message)
   SELECT o.seq, o.epoch, o.owner, o.claimed_at, o.lease_until, $4, u.outcome, u.class, u.message
     FROM unnest($1::int8[], $2::int8[], $3::text[], $5::text[], $6::text[], $8::uuid[])
          AS u(seq, epoch, outcome, class, message, id)
     JOIN occurrences o ON o.id = u.id AND o.seq = u.seq AND o.epoch = u.epoch
    WHERE u.outcome <> 'succeeded' AND u.seq = ANY($7::int8[])
   ON CONFLICT (occurrence_seq, epoch) DO UPDATE
  SET finished_at = excluded.finished_at, outcome = excluded.outcome,
      lease_until = excluded.lease_until, error_class = excluded.error_class,
      error_message = excluded.error_message
WHERE attempts.outcome = 'running'
