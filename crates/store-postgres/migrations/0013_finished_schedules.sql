-- A schedule with nothing left to plan is FINISHED (a one-off whose instant was planned), no
-- longer ACTIVE: it stops counting against the tenant's active-schedule quotas. Until now such
-- schedules stayed ACTIVE without a planning-queue entry, and the queue holds one entry for
-- every ACTIVE schedule with an instant left to plan, so those are exactly the ones to mark.
-- (`NOT EXISTS` plans as an anti-join, one pass over each table.)
UPDATE schedules s SET state = 'FINISHED'
 WHERE s.state = 'ACTIVE'
   AND NOT EXISTS (SELECT 1 FROM schedule_queue q WHERE q.schedule_id = s.id);
