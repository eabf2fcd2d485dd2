-- name: REMOVE
-- Removes the occurrences of a closed retention batch ($1 their ids) with their attempt rows,
-- settled outbox rows and trigger keys (a key may make a new run once its run is gone), and adds them to the rollups per (schedule, version, UTC day,
-- state), widening each rollup's range of planned instants. Returns the occurrences and the
-- attempt rows removed.
WITH gone AS (
    DELETE FROM occurrences WHERE id = ANY($1)
    RETURNING seq, id, tenant_id, schedule_id, version, scheduled_for, state
), attempts_gone AS (
    DELETE FROM attempts a USING gone g WHERE a.occurrence_seq = g.seq RETURNING 1
), keys_gone AS (
    DELETE FROM occurrence_triggers k USING gone g WHERE k.occurrence_id = g.id RETURNING 1
), outbox_gone AS (
    DELETE FROM outbox b USING gone g
     WHERE b.occurrence_id = g.id AND b.settled_at IS NOT NULL RETURNING 1
), counted AS (
    INSERT INTO occurrence_rollups AS r
           (tenant_id, schedule_id, version, day, state, count, first_at, last_at)
    SELECT tenant_id, schedule_id, version,
           scheduled_for - ((scheduled_for % 86400000) + 86400000) % 86400000,
           state, count(*), min(scheduled_for), max(scheduled_for)
      FROM gone GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (schedule_id, version, day, state) DO UPDATE
       SET count = r.count + excluded.count,
           first_at = LEAST(r.first_at, excluded.first_at),
           last_at = GREATEST(r.last_at, excluded.last_at)
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM attempts_gone),
       (SELECT count(*) FROM outbox_gone), (SELECT count(*) FROM counted)
