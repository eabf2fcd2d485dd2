-- A run triggered by an operator may carry its own payload instead of its version's: handed
-- to the worker (or relayed) in its place. NULL for every other occurrence.
ALTER TABLE occurrences ADD COLUMN payload TEXT;
