-- name: QUEUE_MOVE
-- A planning batch's queue entries moved back to their next instants (or out), each only if
-- still where the planner found it, with the definition it carries.
WITH gone AS (
         DELETE FROM schedule_queue q
          USING unnest($1::uuid[], $2::int8[], $3::int4[], $4::int8[], $5::int8[]) AS u(id, tenant, version, expected, next)
          WHERE q.shard = $6 AND q.next_run_at = u.expected AND q.schedule_id = u.id
            AND q.version = u.version AND q.tenant_id = u.tenant
         RETURNING q.schedule_id, q.version, q.tenant_id, u.next, q.kind, q.cron, q.timezone, q.dst_gap, q.dst_fold, q.at, q.every_ms, q.anchor, q.queue, q.priority, q.lease_ms, q.max_attempts, q.backoff_initial_ms, q.backoff_max_ms, q.misfire, q.overlap, q.flex_window_ms),
     back AS (
         INSERT INTO schedule_queue (shard, next_run_at, schedule_id, version, tenant_id, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, priority,
lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms)
         SELECT $6, next, schedule_id, version, tenant_id, kind, cron, timezone, dst_gap, dst_fold, at, every_ms, anchor, queue, priority,
lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms FROM gone WHERE next IS NOT NULL)
     SELECT schedule_id FROM gone
