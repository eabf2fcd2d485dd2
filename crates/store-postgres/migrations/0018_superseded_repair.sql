-- Repairs what a schedule change racing a planning commit could leave behind while the two did
-- not serialize (docs/DESIGN.md, "Why do a planning commit and a schedule change take a lock on
-- the shard?"): occurrences of a superseded version at instants after the change that
-- superseded it, and planning-queue entries of a version that is no longer current (beside
-- an update's entry of the current version, a second one). The repairs are the statements of
-- `SUPERSEDED_REPAIRS` in `src/migrate.rs`, run in this migration's transaction after this
-- file, one by one, so that the log says how many rows each one repaired. Nothing is deleted
-- but queue entries, which are planning positions, not history.
SELECT 1;
