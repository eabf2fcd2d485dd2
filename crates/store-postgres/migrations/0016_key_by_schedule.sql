-- The occurrence key is schedule-major, and it is the schedule's index: one index fewer on
-- the hottest table (docs/DESIGN.md, "Why is the occurrence key schedule-major?").
-- Before, the key was (scheduled_for, schedule_id, version) — time-major, so that planning
-- appended to it — beside occurrences_schedule (schedule_id, scheduled_for) for everything
-- asked per schedule. Every occurrence paid for both, and every claim and completion too:
-- a change of state is not a HOT update (state is in partial-index predicates), so it adds
-- an entry to every index. The key in schedule order serves what occurrences_schedule did
-- (the uniqueness of (schedule_id, version, scheduled_for) is the same whatever the column
-- order); listings across schedules in planned order read the id index, whose ids lead with
-- their planned instant (campanile_core::occurrence_id).
-- Building the new key reads the table once under an exclusive lock: on a large history,
-- plan the upgrade for a quiet minute (0.45 s for a million occurrences here).
ALTER TABLE occurrences ADD CONSTRAINT occurrences_key UNIQUE (schedule_id, scheduled_for, version);
ALTER TABLE occurrences DROP CONSTRAINT occurrences_scheduled_for_schedule_id_version_key;
DROP INDEX occurrences_schedule;
