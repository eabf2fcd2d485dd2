-- The largest payload, in bytes, that any schedule version holds: a claim looks up its
-- candidates' payload sizes (to keep its answer within `OccurrenceClaim::max_bytes`) only when
-- this bound says they could pass it, so claims of small payloads never pay for the look-up
-- on the single writer (docs/DESIGN.md, "Why is a claim's answer bounded in bytes?"). Kept by
-- a trigger on every version written, whatever writes it; it never shrinks.
CREATE TABLE payload_bound (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    max_bytes INTEGER NOT NULL
);
INSERT INTO payload_bound (id, max_bytes)
SELECT 1, COALESCE(MAX(length(CAST(payload AS BLOB))), 0) FROM schedule_versions;
CREATE TRIGGER schedule_versions_payload_bound AFTER INSERT ON schedule_versions
WHEN length(CAST(NEW.payload AS BLOB)) > (SELECT max_bytes FROM payload_bound WHERE id = 1)
BEGIN
    UPDATE payload_bound SET max_bytes = length(CAST(NEW.payload AS BLOB)) WHERE id = 1;
END;
