SET search_path=exp;
WITH ready AS (
     SELECT seq, priority, available_at FROM occurrences
      WHERE tenant_id = 1 AND queue = 'default' AND state IN ('READY', 'RETRY_WAIT') AND available_at <= 2000 AND overlap = 0
      ORDER BY priority DESC, available_at LIMIT 1000 FOR UPDATE SKIP LOCKED),
 expired AS (
     SELECT seq, priority, available_at FROM occurrences
      WHERE tenant_id = 1 AND queue = 'default' AND state = 'RUNNING' AND lease_until <= 2000
        AND attempts < max_attempts AND overlap = 0
      ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED),
 pick AS (
     SELECT seq FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
      ORDER BY priority DESC, available_at, seq LIMIT 1000),
 upd AS (
     UPDATE occurrences o
        SET state = 'RUNNING', owner = 'w:client_id', epoch = o.epoch + 1, attempts = o.attempts + 1,
            lease_until = 9999999, claimed_at = 2000, cancel_requested = false
       FROM pick WHERE o.seq = pick.seq
     RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts),
 prev AS (
     UPDATE attempts a SET outcome = 'lease_expired', finished_at = 2000
       FROM upd WHERE a.occurrence_seq = upd.seq AND a.epoch = upd.epoch - 1 AND a.outcome = 'running'),
 ins AS (
     INSERT INTO attempts (occurrence_seq, epoch, owner, started_at, lease_until, outcome)
     SELECT seq, epoch, 'w:client_id', 2000, 9999999, 'running' FROM upd),
 res AS (
 SELECT upd.seq, upd.id, upd.schedule_id, upd.version, upd.scheduled_for, upd.available_at, upd.epoch,
        upd.attempts, v.payload
   FROM upd LEFT JOIN schedule_versions v ON v.schedule_id = upd.schedule_id AND v.version = upd.version
  ORDER BY upd.available_at, upd.seq)
SELECT coalesce(array_agg(id)::text, '{}') AS ids, count(*) AS n FROM res \gset
BEGIN;
SELECT count(*) FROM (SELECT seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts, backoff_initial_ms, backoff_max_ms FROM occurrences WHERE tenant_id = 1 AND id = ANY(':ids'::uuid[]) ORDER BY seq FOR UPDATE) x;
WITH s AS (SELECT seq, epoch FROM occurrences WHERE id = ANY(':ids'::uuid[])),
 w AS (UPDATE occurrences o SET state = 'SUCCEEDED', result = COALESCE(NULL, o.result), available_at = o.available_at, finished_at = 3000,
        last_error_class = COALESCE(NULL, o.last_error_class), last_error = COALESCE(NULL, o.last_error)
   FROM s WHERE o.seq = s.seq AND o.state = 'RUNNING' AND o.owner = 'w:client_id' AND o.epoch = s.epoch AND o.lease_until > 3000 RETURNING o.seq, o.epoch)
UPDATE attempts a SET outcome = 'succeeded', finished_at = 3000, error_class = NULL, error_message = NULL FROM w WHERE a.occurrence_seq = w.seq AND a.epoch = w.epoch;
COMMIT;
