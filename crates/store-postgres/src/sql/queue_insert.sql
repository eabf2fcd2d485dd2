-- name: QUEUE_INSERT
INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, priority,
lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms)
     SELECT $1, $2, $3, $4, $5, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor, v.queue, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms, v.misfire, v.overlap, v.flex_window_ms FROM schedule_versions v
      WHERE v.schedule_id = $3 AND v.version = $4
