-- An occurrence is found by its id (the partition key, unique) wherever it is looked up: the
-- index on `seq` alone took a new entry at every claim and every completion (each a non-HOT
-- update) and served no lookup the id does not (docs/DESIGN.md, "Why is there no index on an
-- occurrence's seq on PostgreSQL?"). `seq` stays the attempts' reference and the order rows
-- are locked in.
DROP INDEX occurrences_by_seq;
