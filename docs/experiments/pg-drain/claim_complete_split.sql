SET search_path=exp;
WITH pick AS (
     DELETE FROM ready r WHERE (tenant_id, queue, priority, available_at, seq) IN (
        SELECT tenant_id, queue, priority, available_at, seq FROM ready WHERE tenant_id = 1 AND queue = 'default' AND available_at <= 2000
         ORDER BY priority DESC, available_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
     RETURNING seq),
 upd AS (
     UPDATE occurrences o
        SET state = 'RUNNING', owner = 'w:client_id', epoch = o.epoch + 1, attempts = o.attempts + 1,
            lease_until = 9999999, claimed_at = 2000, cancel_requested = false
       FROM pick WHERE o.seq = pick.seq
     RETURNING o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts, o.tenant_id, o.queue),
 lz AS (INSERT INTO leases SELECT seq, tenant_id, queue, 9999999, 'w:client_id', epoch FROM upd),
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
SELECT count(*) FROM (SELECT seq, id, state, owner, epoch, lease_until, available_at, attempts, max_attempts, backoff_initial_ms, backoff_max_ms FROM occurrences WHERE tenant_id = 1 AND id = ANY(':ids'::uuid[]) ORDER BY seq) x;
WITH s AS (SELECT seq, epoch FROM occurrences WHERE id = ANY(':ids'::uuid[])),
 l AS (DELETE FROM leases l USING s WHERE l.seq = s.seq AND l.epoch = s.epoch AND l.owner = 'w:client_id' AND l.lease_until > 3000 RETURNING l.seq, l.epoch),
 w AS (UPDATE occurrences o SET state = 'SUCCEEDED', result = COALESCE(NULL, o.result), available_at = o.available_at, finished_at = 3000,
        last_error_class = COALESCE(NULL, o.last_error_class), last_error = COALESCE(NULL, o.last_error)
   FROM l WHERE o.seq = l.seq RETURNING o.seq, o.epoch)
UPDATE attempts a SET outcome = 'succeeded', finished_at = 3000, error_class = NULL, error_message = NULL FROM w WHERE a.occurrence_seq = w.seq AND a.epoch = w.epoch;
COMMIT;
