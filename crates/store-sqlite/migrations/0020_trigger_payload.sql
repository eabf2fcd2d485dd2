-- A run triggered by an operator may carry its own payload instead of its version's: handed
-- to the worker (or relayed) in its place. NULL for every other occurrence.
ALTER TABLE occurrences ADD COLUMN payload TEXT;
-- How many occurrences hold their own payload: a claim looks their payloads up only while
-- there are some, so claims never pay for the look-up otherwise. Kept by triggers that fire
-- only where a payload is set (an UPDATE that names the column) or an occurrence holding one
-- leaves; the largest payload bound counts them too.
ALTER TABLE payload_bound ADD COLUMN overrides INTEGER NOT NULL DEFAULT 0;
CREATE TRIGGER occurrences_payload_set AFTER UPDATE OF payload ON occurrences
WHEN NEW.payload IS NOT NULL AND OLD.payload IS NULL
BEGIN
    UPDATE payload_bound
       SET overrides = overrides + 1,
           max_bytes = MAX(max_bytes, length(CAST(NEW.payload AS BLOB)))
     WHERE id = 1;
END;
CREATE TRIGGER occurrences_payload_gone AFTER DELETE ON occurrences
WHEN OLD.payload IS NOT NULL
BEGIN
    UPDATE payload_bound SET overrides = overrides - 1 WHERE id = 1;
END;
