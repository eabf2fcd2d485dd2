-- name: VERSIONS_OF_SCHEDULE
-- Every version of a tenant's schedule (`?1` the schedule, `?2` the tenant), oldest first.
SELECT v.version, v.created_at, v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, v.payload, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms
           FROM schedule_versions v JOIN schedules s ON s.id = v.schedule_id
          WHERE v.schedule_id = ?1 AND s.tenant_id = ?2
          ORDER BY v.version
