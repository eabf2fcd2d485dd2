-- name: ELIGIBLE
-- Occurrences retention may take, oldest first ($1 now, $2 the operator's default retention
-- in milliseconds or NULL for forever, $3 the most, ids in ($4, $5]: the window the caller
-- examines): final, planned and finished longer ago
-- than their tenant's retention (`retention_ms`: NULL the default, 0 forever), not their
-- schedule's latest occurrence (its overlap decisions and its cursor need it), and no
-- delivery pending in the outbox. Ids lead with the planned instant, so id order is oldest
-- first. A day partition leaves as a whole once the default retention is past it
-- (`retention_day.rs`), so what this takes from one is only a tenant's whose retention is
-- shorter than the default, or a day that could not be taken whole for two days (work still
-- pending in it); never a row of a day being taken.
SELECT o.id FROM occurrences o JOIN tenants t ON t.id = o.tenant_id
 WHERE o.id > $4 AND o.id <= $5
   AND o.state IN ('SUCCEEDED', 'DEAD', 'CANCELED', 'MISSED', 'SKIPPED_OVERLAP')
   AND COALESCE(t.retention_ms, $2::bigint) > 0
   AND o.scheduled_for < $1 - COALESCE(t.retention_ms, $2::bigint)
   AND COALESCE(o.finished_at, o.scheduled_for) < $1 - COALESCE(t.retention_ms, $2::bigint)
   AND EXISTS (SELECT 1 FROM occurrences n
                WHERE n.schedule_id = o.schedule_id AND n.scheduled_for > o.scheduled_for)
   AND NOT EXISTS (SELECT 1 FROM outbox b WHERE b.occurrence_id = o.id AND b.settled_at IS NULL)
   AND (o.tableoid = 'occurrences_default'::regclass OR $2::bigint IS NULL
        OR COALESCE(t.retention_ms, $2::bigint) < $2::bigint
        OR o.scheduled_for < $1 - $2::bigint - 2 * 86400000)
   AND NOT EXISTS (SELECT 1 FROM retention_days d WHERE o.id >= d.lo AND o.id < d.hi)
 ORDER BY o.id
 LIMIT $3
