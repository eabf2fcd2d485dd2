-- name: WORKER_CLAIM
-- The worker claim in one statement, for one or several claimers of a queue
-- ([`crate::coalesce`]): `clk` reads the database's clock (or takes `$3`, a caller's instant)
-- and whether the tenant and the queue are free of concurrency limits; only then are
-- occurrences picked and claimed, and dealt in claim order to the claimers in turn — each its
-- own count, as owner with its own lease. One row always comes back: the claimed occurrences
-- (columns 0–7, all NULL when none) with the instant (8), the no-limit flag (9), whether
-- overlap-constrained work of the queue is due (10: pending, by the index
-- `occurrences_pending_constrained`, or under an expired lease), the claimer (11, from 1), the
-- lease end (12) and whether work is handed out at all (13: some node's liveness mark is
-- valid, [`fence::hands_out_work`]; else nothing is picked).
-- `$1` tenant, `$2` queue, `$3` now or NULL, `$4` the claimers' total count, `$5` their
-- owners, `$6` their leases in ms, `$7` for each slot of the total, in claim order, its
-- claimer's number (slot `rn` is the `rn`-th occurrence picked), `$8` their claim keys, `$9`
-- their answers' size bounds in bytes ([`OccurrenceClaim::max_bytes`]). Subscripts keep the dealing
-- linear: a join of rows to claimers by ranges would be a nested loop, and a per-slot `text[]`
-- would be walked from its start at every subscript (variable-width elements); `int8[]`
-- subscripts are direct.
WITH clk0 AS (SELECT COALESCE($3::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8) AS now),
   clk AS (
       SELECT now, (SELECT COALESCE((SELECT MAX(alive_until) FROM planner_nodes) > now, TRUE)) AS live,
              NOT EXISTS (SELECT 1 FROM tenants WHERE id = $1 AND max_running IS NOT NULL)
              AND NOT EXISTS (SELECT 1 FROM queue_limits WHERE tenant_id = $1 AND queue = $2
                                 AND max_running IS NOT NULL) AS unlimited
         FROM clk0),
   cst AS (
       SELECT (SELECT live FROM clk) AND (EXISTS (SELECT 1 FROM occurrences
                       WHERE tenant_id = $1 AND queue = $2 AND state IN ('READY', 'RETRY_WAIT')
                         AND overlap <> 0 AND available_at <= (SELECT now FROM clk))
              OR EXISTS (SELECT 1 FROM occurrences
                          WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING'
                            AND lease_until <= (SELECT now FROM clk) AND overlap <> 0
                            AND attempts < max_attempts AND NOT cancel_requested)) AS due),
   ready AS (
       SELECT seq, id, schedule_id, version, priority, available_at, NULL::int8 AS lost_epoch,
              NULL::text AS lost_owner, NULL::int8 AS lost_started, NULL::int8 AS lost_lease,
              payload AS own_payload
         FROM occurrences
        WHERE tenant_id = $1 AND queue = $2 AND state IN ('READY', 'RETRY_WAIT') AND available_at <= (SELECT now FROM clk)
          AND overlap = 0 AND (SELECT unlimited AND live FROM clk)
        ORDER BY priority DESC, available_at LIMIT $4
        FOR UPDATE SKIP LOCKED),
   expired AS (
       SELECT seq, id, schedule_id, version, priority, available_at, epoch, owner, claimed_at, lease_until,
              payload AS own_payload
         FROM occurrences
        WHERE tenant_id = $1 AND queue = $2 AND state = 'RUNNING' AND lease_until <= (SELECT now FROM clk)
          AND attempts < max_attempts AND NOT cancel_requested AND overlap = 0 AND (SELECT unlimited AND live FROM clk)
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
                      ($7::int8[])[k.rn] AS ord, COALESCE(k.own_payload, v.payload) AS payload,
                      COALESCE(octet_length(COALESCE(k.own_payload, v.payload)), 0) + 512 AS bytes
                 FROM ranked k
                 LEFT JOIN schedule_versions v ON v.schedule_id = k.schedule_id AND v.version = k.version) s),
   cand AS (
       SELECT seq, id, lost_epoch, lost_owner, lost_started, lost_lease, rn, ord, payload
         FROM sized WHERE upto = bytes OR upto <= ($9::int8[])[ord]),
   pick AS (
       SELECT seq, id, lost_epoch, lost_owner, lost_started, lost_lease, ord, payload,
              ($5::text[])[ord] AS claimant, ($6::int8[])[ord] AS lease_ms,
              ($8::uuid[])[ord] AS claim_key
         FROM cand),
   lost AS (
       INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, finished_at, outcome)
       SELECT seq, lost_epoch, lost_owner, lost_started, lost_lease, (SELECT now FROM clk), 'lease_expired'
         FROM pick WHERE lost_epoch IS NOT NULL
       ON CONFLICT (occurrence_seq, epoch) DO UPDATE
  SET finished_at = excluded.finished_at, outcome = excluded.outcome,
      lease_until = excluded.lease_until, error_class = excluded.error_class,
      error_message = excluded.error_message
WHERE attempts.outcome = 'running'),
   upd AS (
       UPDATE occurrences o
          SET state = 'RUNNING', owner = pick.claimant, epoch = o.epoch + 1, attempts = o.attempts + 1,
              lease_until = ((SELECT now FROM clk) + COALESCE(pick.lease_ms, o.lease_ms)), claimed_at = (SELECT now FROM clk), cancel_requested = false,
              ran_until = NULL, claim_key = pick.claim_key,
              available_at = CASE WHEN pick.lost_epoch IS NOT NULL
                                  THEN GREATEST(o.available_at, pick.lost_lease)
                                  ELSE o.available_at END
         FROM pick WHERE o.seq = pick.seq AND o.id = pick.id
       RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
                 o.lease_until, pick.ord AS tag, pick.payload),
   claimed AS (
       SELECT id, schedule_id, version, scheduled_for, available_at, epoch, attempts, payload, seq, tag,
              lease_until
         FROM upd)
   SELECT c.id, c.schedule_id, c.version, c.scheduled_for, c.available_at, c.epoch, c.attempts,
          c.payload, clk.now, clk.unlimited, cst.due, c.tag, c.lease_until, clk.live
     FROM clk CROSS JOIN cst LEFT JOIN claimed c ON true
    ORDER BY c.available_at, c.seq
