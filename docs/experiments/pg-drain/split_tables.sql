DROP INDEX occurrences_pending;
DROP INDEX occurrences_running_queue;
DROP INDEX occurrences_running;
DROP INDEX occurrences_running_schedule;
ALTER TABLE attempts SET (fillfactor = 50);
CREATE TABLE ready (
    tenant_id BIGINT NOT NULL, queue TEXT NOT NULL, priority INTEGER NOT NULL, available_at BIGINT NOT NULL, seq BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, queue, priority, available_at, seq));
CREATE TABLE leases (
    seq BIGINT PRIMARY KEY, tenant_id BIGINT NOT NULL, queue TEXT NOT NULL, lease_until BIGINT NOT NULL, owner TEXT NOT NULL, epoch BIGINT NOT NULL);
CREATE INDEX leases_queue ON leases (tenant_id, queue, lease_until);
CREATE INDEX leases_due ON leases (lease_until);
ALTER TABLE occurrences SET (fillfactor = 40);
