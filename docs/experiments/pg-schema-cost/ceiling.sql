-- `campanile bench ceiling`'s PostgreSQL step (crates/bench/src/ceiling.rs): complete the
-- batch held, claim the next 1,000, one transaction.
BEGIN;
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now \gset
UPDATE ceiling c SET state = 'SUCCEEDED', result = 'true', finished_at = :now
 WHERE c.seq = ANY(':seqs'::int8[])
   AND c.epoch = (':epochs'::int8[])[array_position(':seqs'::int8[], c.seq)]
   AND c.owner = 'w:client_id' AND c.state = 'RUNNING' AND c.lease_until > :now;
WITH ready AS (
       SELECT seq, available_at AS at FROM ceiling
        WHERE state = 'READY' AND available_at <= :now
        ORDER BY available_at LIMIT 1000 FOR UPDATE SKIP LOCKED),
     expired AS (
       SELECT seq, lease_until AS at FROM ceiling
        WHERE state = 'RUNNING' AND lease_until <= :now
        ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED),
     claimed AS (
       UPDATE ceiling SET state = 'RUNNING', owner = 'w:client_id', epoch = epoch + 1,
              lease_until = :now + 60000
        WHERE seq = ANY(ARRAY(SELECT seq FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) c
                               ORDER BY at LIMIT 1000))
       RETURNING seq, epoch)
SELECT COALESCE(array_agg(seq)::text, '{}') AS seqs, COALESCE(array_agg(epoch)::text, '{}') AS epochs
  FROM claimed \gset
COMMIT;
