-- Retention (docs/DESIGN.md, "Why is history archived and removed?"): a tenant's finished
-- occurrences older than its retention are archived, then removed from the hot store.
-- `retention_ms`: NULL the operator's default, 0 forever, else milliseconds.
ALTER TABLE tenants ADD COLUMN retention_ms BIGINT;

-- The open retention batch (a batch's row is removed when it closes): the ids it chose, recorded before anything is archived, so a
-- node that dies between writing the archive and removing the rows leaves the batch to be
-- finished (its archive files written again under the same name), never chosen twice.
CREATE TABLE retention_batches (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner        TEXT    NOT NULL,
    lease_until  BIGINT  NOT NULL,
    ids          UUID[]  NOT NULL,
    opened_at    BIGINT  NOT NULL,
    abandoned    BOOLEAN NOT NULL DEFAULT false  -- given up: its files are being deleted
);
-- One row to lock: nodes open and close batches one at a time.
CREATE TABLE retention_lock (
    id  INTEGER PRIMARY KEY CHECK (id = 1)
);
INSERT INTO retention_lock (id) VALUES (1);

-- What retention removed, counted per schedule version, UTC day and final state, with the
-- range of planned instants: `campanile reconcile` classifies an instant inside such a range
-- that has no row left as archived, not missing.
CREATE TABLE occurrence_rollups (
    tenant_id    BIGINT  NOT NULL,
    schedule_id  UUID    NOT NULL,
    version      INTEGER NOT NULL,
    day          BIGINT  NOT NULL,      -- the UTC midnight of the planned instants
    state        TEXT    NOT NULL,
    count        BIGINT  NOT NULL,
    first_at     BIGINT  NOT NULL,
    last_at      BIGINT  NOT NULL,
    PRIMARY KEY (schedule_id, version, day, state)
);
