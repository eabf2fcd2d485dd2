-- From this version on, an attempt in progress and an attempt that succeeded are held by the
-- occurrence row (owner, epoch, claimed_at, lease_until, finished_at), not by an `attempts`
-- row: a claim and a success write no attempt row, and `attempts` records the attempts that
-- ended otherwise (failed, lease expired). The `running` rows older versions opened at claim
-- time for the attempts in progress now are copies of what their occurrence rows hold, and
-- would stay `running` in this table once those attempts succeed: they are removed. No
-- attempt is lost: the API shows each of them from its occurrence row.
DELETE FROM attempts
 WHERE outcome = 'running'
   AND EXISTS (SELECT 1 FROM occurrences o
                WHERE o.seq = attempts.occurrence_seq AND o.epoch = attempts.epoch
                  AND o.state IN ('RUNNING', 'SUCCEEDED'));
