-- name: CLAIM_IDS
-- The claim of occurrences already chosen and locked by the caller's transaction (so this
-- statement's snapshot sees them as locked). `$1` their ids, `$2` owner, `$3` now, `$4`
-- lease length in ms (NULL: each occurrence's own), `$5` the claim's key or NULL.
WITH pick AS (
       SELECT o.seq, o.id, CASE WHEN o.state = 'RUNNING' THEN o.epoch END AS lost_epoch,
              o.owner AS lost_owner, o.claimed_at AS lost_started, o.lease_until AS lost_lease,
              COALESCE(o.payload, v.payload) AS payload
         FROM occurrences o
         LEFT JOIN schedule_versions v ON v.schedule_id = o.schedule_id AND v.version = o.version
        WHERE o.id = ANY($1::uuid[])),
   lost AS (
       INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
       SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, $3, 'lease_expired'
         FROM pick WHERE lost_epoch IS NOT NULL
       ON CONFLICT (occurrence_seq, epoch) DO UPDATE
  SET finished_at = excluded.finished_at, outcome = excluded.outcome,
      lease_until = excluded.lease_until, error_class = excluded.error_class,
      error_message = excluded.error_message
WHERE attempts.outcome = 'running'),
   upd AS (
       UPDATE occurrences o
          SET state = 'RUNNING', owner = $2, epoch = o.epoch + 1, attempts = o.attempts + 1,
              lease_until = $3 + COALESCE($4::int8, o.lease_ms), claimed_at = $3, cancel_requested = false,
              ran_until = NULL, claim_key = $5::uuid,
              available_at = CASE WHEN pick.lost_epoch IS NOT NULL
                                  THEN GREATEST(o.available_at, pick.lost_lease)
                                  ELSE o.available_at END
         FROM pick WHERE o.id = pick.id AND o.seq = pick.seq
       RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                 o.lease_until, NULL::int8 AS tag, pick.payload),
   claimed AS (
       SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, seq, tag,
              lease_until
         FROM upd)
   SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, lease_until
     FROM claimed ORDER BY available_at, seq
