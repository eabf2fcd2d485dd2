-- name: OUTAGE_VERSION
-- A schedule version's definition and how far it is planned, for the outage check.
SELECT v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, NULL, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms,
                (SELECT MAX(o.scheduled_for) FROM occurrences o
                  WHERE o.schedule_id = v.schedule_id AND o.version = v.version)
           FROM schedule_versions v WHERE v.schedule_id = ?1 AND v.version = ?2
