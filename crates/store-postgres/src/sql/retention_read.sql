-- name: READ
-- A retention batch's occurrences ($1 their ids): [`OCC_COLS`], then `claimed_at` (19), each
-- joined with its attempt rows (columns 20–27, NULL when it has none), then the tenant's id
-- (28) and name (29), then `origin` (30) and the run's own payload (31); by tenant,
-- occurrence, attempt.
SELECT o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.queue, o.priority, o.state, o.epoch, o.owner, o.lease_until, o.attempts, o.max_attempts, o.cancel_requested, o.result, o.last_error_class, o.last_error, o.finished_at, o.claimed_at, a.epoch, a.owner, a.started_at, a.lease_until, a.finished_at, a.outcome,
      a.error_class, a.error_message, o.tenant_id, t.name, o.origin, o.payload
 FROM occurrences o JOIN tenants t ON t.id = o.tenant_id
 LEFT JOIN attempts a ON a.occurrence_seq = o.seq
WHERE o.id = ANY($1)
ORDER BY o.tenant_id, o.id, a.epoch
