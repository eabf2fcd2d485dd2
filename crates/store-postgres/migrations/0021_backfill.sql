-- A tenant's catch-up pace cursor: when its next paced late run may become available
-- (milliseconds; NULL: none reserved yet). Every planning pass, outage check and backfill
-- reserves its slots by moving it on, so the tenant's `max_catchup_per_sec` holds across
-- passes, nodes, resumes and outages.
ALTER TABLE tenants ADD COLUMN catchup_next_at BIGINT;

-- One backfill of a past range of a schedule version (`POST /v1/schedules/{id}/backfill`):
-- what it made, what it ran again and what it found already there, so that one sent again with its
-- `Idempotency-Key` answers the same.
CREATE TABLE backfills (
    id           UUID    PRIMARY KEY,
    tenant_id    BIGINT  NOT NULL,
    schedule_id  UUID    NOT NULL,
    version      INTEGER NOT NULL,
    idem_key     TEXT,
    range_from   BIGINT  NOT NULL,
    range_to     BIGINT  NOT NULL,
    overlap      INTEGER,
    instants     INTEGER NOT NULL,
    created      BIGINT[] NOT NULL,     -- the instants made
    rerun        BIGINT[] NOT NULL,     -- the MISSED instants made READY again
    existing     BIGINT[] NOT NULL,     -- the instants found
    created_at   BIGINT  NOT NULL
);
CREATE UNIQUE INDEX backfills_key ON backfills (schedule_id, idem_key) WHERE idem_key IS NOT NULL;
