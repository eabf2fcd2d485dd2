#!/bin/bash
# usage: setup.sh N [schema-change.sql]
# A schema `exp` with campanile's PostgreSQL migrations, an optional change applied before
# any data, then N schedule versions and N READY occurrences due at once (random heap order).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DB=${DB:-postgres://postgres@127.0.0.1:5432/test}
P="psql -q -v ON_ERROR_STOP=1 $DB"
$P -c "DROP SCHEMA IF EXISTS exp CASCADE" -c "CREATE SCHEMA exp" 2>/dev/null
for f in "$here"/../../../crates/store-postgres/migrations/000*.sql; do (echo "SET search_path=exp;"; cat "$f") | $P; done
if [ -n "${2:-}" ]; then (echo "SET search_path=exp;"; cat "$2") | $P; fi
$P <<SQL
SET search_path=exp;
INSERT INTO schedule_versions (schedule_id, version, kind, cron, timezone, queue, payload, priority, lease_ms, max_attempts, backoff_initial_ms, backoff_max_ms, misfire, overlap, flex_window_ms, created_at)
SELECT gen_random_uuid(), 1, 'cron', '0 9 * * *', 'UTC', 'default', '{"n":1}', 0, 30000, 3, 1000, 60000, 'SKIP', 'ALLOW', 0, 0 FROM generate_series(1,$1);
INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at, queue, priority, state, max_attempts, backoff_initial_ms, backoff_max_ms, created_at)
SELECT gen_random_uuid(), 1, schedule_id, 1, 1000, 1000, 'default', 0, 'READY', 3, 1000, 60000, 0 FROM schedule_versions ORDER BY random();
CHECKPOINT;
SQL
