-- The key a worker gave the claim that holds an occurrence (`OccurrenceClaim::key`), so that
-- a claim sent again after its answer was lost gets the occurrences its first sending claimed
-- instead of new ones (docs/DESIGN.md, "Why does a claim carry a key?"). Written by
-- every claim (NULL when the worker gave none); only read with the owner, the epoch's state
-- and an unexpired lease, so a stale value on a row no longer running is never read.
ALTER TABLE occurrences ADD COLUMN claim_key uuid;
