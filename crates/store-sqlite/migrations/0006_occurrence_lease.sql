-- Each occurrence carries its schedule's lease length: a claim or renewal that names no
-- lease grants it (before, a schedule's lease_seconds was stored and never applied). Existing
-- occurrences get 30 s, what such claims granted until now.
ALTER TABLE occurrences ADD COLUMN lease_ms INTEGER NOT NULL DEFAULT 30000;
