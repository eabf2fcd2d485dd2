-- name: SCHEDULE_BY_ID
-- A tenant's schedule (`?1` the schedule, `?2` the tenant) with its current version's definition.
SELECT s.id, s.tenant_id, s.version, s.state, s.shard, s.next_run_at, s.created_at, s.updated_at, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, v.payload, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms
           FROM schedules s JOIN schedule_versions v ON v.schedule_id = s.id AND v.version = s.version
          WHERE s.id = ?1 AND s.tenant_id = ?2
