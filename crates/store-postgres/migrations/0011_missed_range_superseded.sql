-- A summarized gap says why its instants did not run: judged late by the misfire policy
-- (false), or superseded by an update or a cancel before they were planned (true, recorded as
-- canceled). Existing rows stay false ("missed"), as `reconcile` classified them until now.
ALTER TABLE missed_ranges ADD COLUMN superseded BOOLEAN NOT NULL DEFAULT false;
