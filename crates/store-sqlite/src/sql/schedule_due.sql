-- name: SCHEDULE_DUE
-- The due queue entries of a shard (`?1`) at `?2`, with their versions' definitions, earliest first, at most `?3`.
SELECT q.schedule_id, q.tenant_id, q.version, q.next_run_at, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, v.payload, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms
       FROM schedule_queue q
       JOIN schedule_versions v ON v.schedule_id = q.schedule_id AND v.version = q.version
      WHERE q.shard = ?1 AND q.next_run_at <= ?2
      ORDER BY q.next_run_at LIMIT ?3
