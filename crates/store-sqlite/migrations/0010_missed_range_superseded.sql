-- A summarized gap says why its instants did not run: judged late by the misfire policy (0), or
-- superseded by an update or a cancel before they were planned (1, recorded as canceled).
-- Existing rows stay 0 ("missed"), as `reconcile` classified them until now.
ALTER TABLE missed_ranges ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0;
