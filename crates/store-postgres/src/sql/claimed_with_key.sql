-- name: CLAIMED_WITH_KEY
-- What a worker claimed with a key in a queue and still holds: `$1` tenant, `$2` queue, `$3`
-- the caller's instant or NULL, `$4` the worker, `$5` the key, `$6` at most this many (the
-- claim's `max`). The queue's unexpired leases are a range of `occurrences_running_queue`.
SELECT o.id, o.schedule_id, o.version, o.scheduled_for, o.available_at, o.epoch, o.attempts,
      COALESCE(o.payload, v.payload), o.lease_until, o.claimed_at
 FROM occurrences o
 LEFT JOIN schedule_versions v ON v.schedule_id = o.schedule_id AND v.version = o.version
WHERE o.tenant_id = $1 AND o.queue = $2 AND o.state = 'RUNNING'
  AND o.lease_until > COALESCE($3::int8, (extract(epoch FROM clock_timestamp()) * 1000)::int8) AND o.owner = $4 AND o.claim_key = $5
ORDER BY o.available_at, o.seq LIMIT $6
