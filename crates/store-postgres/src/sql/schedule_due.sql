-- name: SCHEDULE_DUE
-- The front of a shard's queue, each entry with the definition it carries (migration 0006):
-- the pass reads nothing but the queue, so its cost follows the number of schedules due and
-- not the number stored. The payload is not read: planning does not need it.
SELECT v.schedule_id, v.tenant_id, v.version, v.next_run_at, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, NULL::text, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms
       FROM schedule_queue v
      WHERE v.shard = $1 AND v.next_run_at <= $2
      ORDER BY v.next_run_at LIMIT $3
