-- The ceiling's claim on the store's table: its claim order (tenant, queue, priority,
-- availability), the columns its claim writes, rows found by id (the partition key).
WITH ready AS (
       SELECT id, priority, available_at AS at FROM occurrences
        WHERE tenant_id = 1 AND queue = 'bench' AND state IN ('READY', 'RETRY_WAIT')
          AND available_at <= :now AND overlap = 0
        ORDER BY priority DESC, available_at LIMIT 1000 FOR UPDATE SKIP LOCKED),
     expired AS (
       SELECT id, priority, lease_until AS at FROM occurrences
        WHERE tenant_id = 1 AND queue = 'bench' AND state = 'RUNNING' AND lease_until <= :now
          AND attempts < max_attempts AND NOT cancel_requested AND overlap = 0
        ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED),
     claimed AS (
       UPDATE occurrences SET state = 'RUNNING', owner = 'w:client_id', epoch = epoch + 1,
              attempts = attempts + 1, lease_until = :now + 60000, claimed_at = :now,
              cancel_requested = false, ran_until = NULL, claim_key = NULL
        WHERE id = ANY(ARRAY(SELECT id FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
                              ORDER BY priority DESC, at LIMIT 1000))
       RETURNING id, epoch)
SELECT COALESCE(array_agg(id)::text, '{}') AS ids, COALESCE(array_agg(epoch)::text, '{}') AS epochs
  FROM claimed \gset
