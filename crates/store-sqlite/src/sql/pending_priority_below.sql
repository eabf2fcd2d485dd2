-- name: PENDING_PRIORITY_BELOW
-- The next pending priority below `?3` of a queue (`?1` tenant, `?2` queue): occurrences without an overlap policy.
SELECT priority FROM occurrences
WHERE tenant_id = ?1 AND queue = ?2 AND state IN ('READY', 'RETRY_WAIT')
  AND overlap = 0 AND priority < ?3
ORDER BY priority DESC LIMIT 1
