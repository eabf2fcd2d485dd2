#!/bin/bash
# usage: run.sh N script.sql [schema-change.sql [after-fill.sql]]
# Drains N due occurrences with 8 pgbench clients, each looping "claim 1,000, complete them"
# with script.sql; prints completed count, WAL written, WAL bytes per occurrence, seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DB=${DB:-postgres://postgres@127.0.0.1:5432/test}
"$here/setup.sh" "$1" "${3:-}" >/dev/null 2>&1
if [ -n "${4:-}" ]; then psql -q "$DB" -f "$4"; fi
L0=$(psql -qAt "$DB" -c "select pg_current_wal_lsn()")
T0=$(date +%s.%N)
pgbench -n -M simple -c 8 -j 2 -t $(( $1 / 8000 + 3 )) -f "$2" "$DB" > /tmp/pg-drain-pgbench.out 2>&1
T1=$(date +%s.%N)
psql -qAt "$DB" -c "select (select count(*) from exp.occurrences where state='SUCCEEDED'), pg_size_pretty(pg_current_wal_lsn() - '$L0'::pg_lsn), round((pg_current_wal_lsn() - '$L0'::pg_lsn) / $1.0)" | tr '\n' ' '
echo " secs=$(echo "$T1 - $T0" | bc)"
psql -q "$DB" -c "DROP SCHEMA exp CASCADE" 2>/dev/null
