-- name: FAST_CLAIM
-- The worker claim: at most `$4` due or lease-expired occurrences of one queue, picked and
-- claimed in one statement. `$1` tenant, `$2` queue, `$3` now, `$4` max, `$5` owner, `$6`
-- lease length in ms (NULL: each occurrence's own), `$7` the caller's instant or NULL, for the
-- liveness gate (sql/README.md), `$8` the claim's key or NULL, `$9` the answer's size
-- bound in bytes ([`OccurrenceClaim::max_bytes`]).
WITH ready AS (
       SELECT seq, id, schedule_id, version, priority, available_at, NULL::int8 AS lost_epoch,
              NULL::text AS lost_owner, NULL::int8 AS lost_started, NULL::int8 AS lost_lease,
              payload AS own_payload
         FROM occurrences
        WHERE tenant_id = $1 AND queue = $2 AND state IN ('READY', 'RETRY_WAIT') AND available_at <= $3
          AND overlap = 0 AND (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > COALESCE($7::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8), TRUE))
        ORDER BY priority DESC, available_at LIMIT $4
        FOR UPDATE SKIP LOCKED),
   expired AS (
       SELECT seq, id, schedule_id, version, priority, available_at, epoch, owner, claimed_at, lease_until,
              payload AS own_payload
         FROM occurrences
        WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING' AND lease_until <= $3
          AND attempts < max_attempts AND NOT cancel_requested AND overlap = 0 AND (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > COALESCE($7::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8), TRUE))
        ORDER BY lease_until LIMIT $4
        FOR UPDATE SKIP LOCKED),
   ranked AS (
       SELECT seq, id, schedule_id, version, lost_epoch, lost_owner, lost_started, lost_lease, own_payload,
              row_number() OVER (ORDER BY priority DESC, available_at, seq) AS rn
         FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
        ORDER BY priority DESC, available_at, seq LIMIT $4),
   sized AS (
       SELECT s.*, sum(bytes) OVER (PARTITION BY ord ORDER BY rn) AS upto
         FROM (SELECT k.seq, k.id, k.lost_epoch, k.lost_owner, k.lost_started, k.lost_lease, k.rn,
                      1::int8 AS ord, COALESCE(k.own_payload, v.payload) AS payload,
                      COALESCE(octet_length(COALESCE(k.own_payload, v.payload)), 0) + 512 AS bytes
                 FROM ranked k
                 LEFT JOIN schedule_versions v ON v.schedule_id = k.schedule_id AND v.version = k.version) s),
   pick AS (
       SELECT seq, id, lost_epoch, lost_owner, lost_started, lost_lease, rn, ord, payload
         FROM sized WHERE upto = bytes OR upto <= $9),
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
          SET state = 'RUNNING', owner = $5, epoch = o.epoch + 1, attempts = o.attempts + 1,
              lease_until = $3 + COALESCE($6::int8, o.lease_ms), claimed_at = $3, cancel_requested = false,
              ran_until = NULL, claim_key = $8::uuid,
              available_at = CASE WHEN pick.lost_epoch IS NOT NULL
                                  THEN GREATEST(o.available_at, pick.lost_lease)
                                  ELSE o.available_at END
         FROM pick WHERE o.seq = pick.seq AND o.id = pick.id
       RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                 o.lease_until, NULL::int8 AS tag, pick.payload),
   claimed AS (
       SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, seq, tag,
              lease_until
         FROM upd)
   SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, lease_until
     FROM claimed ORDER BY available_at, seq
