-- Retention (docs/DESIGN.md, "Why is history archived and removed?"): a tenant's finished
-- occurrences older than its retention are archived, then removed from the hot store.
-- `retention_ms`: NULL the operator's default, 0 forever, else milliseconds.
ALTER TABLE tenants ADD COLUMN retention_ms INTEGER;

-- The open retention batch (a batch's row is removed when it closes): the ids it chose, recorded before anything is archived, so a
-- node that dies between writing the archive and removing the rows leaves the batch to be
-- finished (its archive files written again under the same name), never chosen twice.
-- AUTOINCREMENT: a batch's number names its archive files, so a number is never used again
-- (a plain rowid would start again at 1 once the table is empty, and overwrite the files of
-- an earlier batch).
CREATE TABLE retention_batches (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    owner        TEXT    NOT NULL,
    lease_until  INTEGER NOT NULL,
    ids          BLOB    NOT NULL,      -- the occurrence ids, 16 bytes each
    opened_at    INTEGER NOT NULL,
    abandoned    INTEGER NOT NULL DEFAULT 0  -- given up: its files are being deleted
);

-- What retention removed, counted per schedule version, UTC day and final state, with the
-- range of planned instants: `campanile reconcile` classifies an instant inside such a range
-- that has no row left as archived, not missing.
CREATE TABLE occurrence_rollups (
    tenant_id    INTEGER NOT NULL,
    schedule_id  BLOB    NOT NULL,
    version      INTEGER NOT NULL,
    day          INTEGER NOT NULL,      -- the UTC midnight of the planned instants
    state        TEXT    NOT NULL,
    count        INTEGER NOT NULL,
    first_at     INTEGER NOT NULL,
    last_at      INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, version, day, state)
) WITHOUT ROWID;
