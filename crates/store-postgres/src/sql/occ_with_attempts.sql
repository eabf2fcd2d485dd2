-- name: OCC_WITH_ATTEMPTS
-- One occurrence (`$1` its seq, `$2` its id, which names its day partition; [`OCC_COLS`],
-- then `claimed_at`) joined with its attempt rows (columns 20–27, NULL when it has none), then
-- `origin` (28) and the run's own payload (29), oldest first.
SELECT o.seq, o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.queue, o.priority, o.state, o.epoch, o.owner, o.lease_until, o.attempts, o.max_attempts, o.cancel_requested, o.result, o.last_error_class, o.last_error, o.finished_at, o.claimed_at, a.epoch, a.owner, a.started_at, a.lease_until, a.finished_at, a.outcome,
      a.error_class, a.error_message, o.origin, o.payload
 FROM occurrences o LEFT JOIN attempts a ON a.occurrence_seq = o.seq
WHERE o.seq = $1 AND o.id = $2 ORDER BY a.epoch
