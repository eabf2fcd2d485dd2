-- A schedule with nothing left to plan is FINISHED (a one-off whose instant was planned), no
-- longer ACTIVE: it stops counting against the tenant's active-schedule quotas. Until now such
-- schedules stayed ACTIVE without a planning-queue entry, and the queue holds one entry for
-- every ACTIVE schedule with an instant left to plan, so those are exactly the ones to mark.
-- `NOT IN` over the queue: SQLite builds one temporary index of the queue's ids for it.
UPDATE schedules SET state = 'FINISHED'
 WHERE state = 'ACTIVE'
   AND id NOT IN (SELECT schedule_id FROM schedule_queue);
