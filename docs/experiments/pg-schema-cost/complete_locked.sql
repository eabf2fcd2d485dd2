-- The store's success as FINISH_SUCCESSES writes it (crates/store-postgres/src/finish.rs):
-- the reported rows locked first, the fence tested on them as locked.
WITH items AS (SELECT * FROM unnest(':ids'::uuid[], ':epochs'::int8[]) AS u(id, epoch)),
     cur AS (
       SELECT o.seq, o.id, o.state, o.owner, o.epoch, o.lease_until, items.epoch AS sent
         FROM occurrences o JOIN items ON o.id = items.id
        WHERE o.tenant_id = 1 ORDER BY o.seq FOR UPDATE OF o),
     upd AS (
       UPDATE occurrences o SET state = 'SUCCEEDED', result = COALESCE('true', o.result),
              finished_at = :now, ran_until = :now
         FROM cur
        WHERE o.seq = cur.seq AND o.id = cur.id AND cur.state = 'RUNNING' AND cur.owner = 'w:client_id'
          AND cur.epoch = cur.sent AND cur.lease_until > :now
       RETURNING o.seq)
SELECT count(*) FROM cur WHERE cur.seq IN (SELECT seq FROM upd);
