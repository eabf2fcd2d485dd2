-- name: OUTAGE_GROUPS
-- The never-claimed occurrences that became claimable inside an outage (`$1` to `$2`), grouped per schedule version with its definition and how far it is planned.
WITH c AS (
            SELECT schedule_id, version, scheduled_for, tenant_id FROM occurrences
             WHERE state IN ('READY', 'RETRY_WAIT') AND state = 'READY' AND attempts = 0
               AND available_at >= $1 AND available_at < $2
               -- Runs an operator asked for (triggered, backfilled) are late on purpose.
               AND origin IS NULL)
         SELECT c.schedule_id, c.version, array_agg(c.scheduled_for ORDER BY c.scheduled_for),
                (SELECT max(o.scheduled_for) FROM occurrences o
                  WHERE o.schedule_id = c.schedule_id AND o.version = c.version),
                v.kind, v.cron, v.timezone, v.dst_gap, v.dst_fold, v.at, v.every_ms, v.anchor,
v.queue, NULL::text, v.priority, v.lease_ms, v.max_attempts, v.backoff_initial_ms, v.backoff_max_ms,
v.misfire, v.overlap, v.flex_window_ms, min(c.tenant_id)
           FROM c JOIN schedule_versions v ON v.schedule_id = c.schedule_id AND v.version = c.version
          GROUP BY c.schedule_id, c.version, v.schedule_id, v.version
