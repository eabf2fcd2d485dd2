-- The store's success written by id, fenced, as the ceiling's completion is.
UPDATE occurrences o SET state = 'SUCCEEDED', result = COALESCE('true', o.result), finished_at = :now,
       ran_until = :now
 WHERE o.id = ANY(':ids'::uuid[])
   AND o.epoch = (':epochs'::int8[])[array_position(':ids'::uuid[], o.id)]
   AND o.tenant_id = 1 AND o.owner = 'w:client_id' AND o.state = 'RUNNING' AND o.lease_until > :now;
