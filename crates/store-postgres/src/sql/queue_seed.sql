-- name: QUEUE_SEED
-- Bulk-created schedules ($2 ids, $3 shards, $4 positions, of tenant $1) entered in the queue
-- with the definition of version 1 of schedule $5, which they all share.
INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, priority,
lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms)
     SELECT u.shard, u.next, u.id, 1, $1, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor, v.queue, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms, v.misfire, v.overlap, v.flex_window_ms
       FROM unnest($2::uuid[], $3::int4[], $4::int8[]) AS u(id, shard, next), schedule_versions v
      WHERE u.next IS NOT NULL AND v.schedule_id = $5 AND v.version = 1
