#!/bin/bash
# usage: [STEPS="complete+claim ..."] run.sh [ROUNDS] [N]
#        (campanile on PATH or $CAMPANILE; $DB, default the CI database, without a query string)
# Drains N due rows with 8 pgbench clients, alternating `bench ceiling`'s table (ceiling.sql)
# and the `occurrences` table of `campanile migrate` (each of $STEPS: a completion and a claim,
# from the .sql files here or, for worker_claim, the store's own statement via
# worker_claim.py), each in a fresh schema `exp_cost`; prints occurrences per second of each
# and its ratio to the ceiling of its round. Each client runs twice its share of steps (SKIP
# LOCKED deals batches unevenly); the rate is taken from the start to the last completion's
# instant (`finished_at`), so the steps past the end, which claim nothing, do not count.
set -euo pipefail
shopt -s inherit_errexit
here=$(cd "$(dirname "$0")" && pwd)
DB=${DB:-postgres://postgres@127.0.0.1:5432/test}
BIN=${CAMPANILE:-campanile}
ROUNDS=${1:-3}; N=${2:-100000}
STEPS=${STEPS:-"complete+claim complete_locked+claim complete_locked+worker_claim"}
export PGOPTIONS="-c client_min_messages=warning"
work=$(mktemp -d)
trap 'psql -q "$DB" -c "DROP SCHEMA IF EXISTS exp_cost CASCADE"; rm -rf "$work"' EXIT
psql_() { psql -q -v ON_ERROR_STOP=1 "$DB" "$@"; }

# A step on `occurrences`: BEGIN, the instant, a completion of what the client holds, a claim.
step() {
    local complete=${1%+*} claim=${1#*+}
    {
        echo "BEGIN;"
        echo "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now \\gset"
        cat "$here/$complete.sql"
        if [ "$claim" = worker_claim ]; then python3 "$here/worker_claim.py"; else cat "$here/$claim.sql"; fi
        echo "COMMIT;"
    } > "$work/$1.sql"
}

setup() {
    psql_ -c "DROP SCHEMA IF EXISTS exp_cost CASCADE" -c "CREATE SCHEMA exp_cost"
    if [ "$1" = ceiling ]; then
        psql_ <<SQL
SET search_path = exp_cost;
CREATE TABLE ceiling (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id UUID NOT NULL UNIQUE,
    schedule_id UUID NOT NULL, version INTEGER NOT NULL, scheduled_for BIGINT NOT NULL,
    available_at BIGINT NOT NULL, state TEXT NOT NULL, owner TEXT,
    epoch BIGINT NOT NULL DEFAULT 0, lease_until BIGINT, finished_at BIGINT, result TEXT,
    UNIQUE (schedule_id, version, scheduled_for));
CREATE INDEX ceiling_ready ON ceiling (available_at) WHERE state = 'READY';
CREATE INDEX ceiling_leased ON ceiling (lease_until) WHERE state = 'RUNNING';
INSERT INTO ceiling (id, schedule_id, version, scheduled_for, available_at, state)
SELECT gen_random_uuid(), s, 1, t - g, t - g, 'READY'
  FROM (SELECT gen_random_uuid() AS s, (extract(epoch FROM now()) * 1000)::int8 AS t) x,
       generate_series(1, $N) AS g;
ANALYZE ceiling;
SQL
    else
        "$BIN" migrate --database "$DB?options=-c%20search_path%3Dexp_cost" >/dev/null
        # Ids lead with their planned instant (the partition key; the check constraint
        # occurrences_id_leads_with_instant).
        psql_ <<SQL
SET search_path = exp_cost;
INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, available_at,
                         queue, priority, state, max_attempts, backoff_initial_ms,
                         backoff_max_ms, created_at)
SELECT encode(substring(int8send(t - g) FROM 3 FOR 6)
              || substring(uuid_send(gen_random_uuid()) FROM 7 FOR 10), 'hex')::uuid,
       1, s, 1, t - g, t - g, 'bench', 0, 'READY', 3, 1000, 60000, t
  FROM (SELECT gen_random_uuid() AS s, (extract(epoch FROM now()) * 1000)::int8 AS t) x,
       generate_series(1, $N) AS g;
ANALYZE occurrences;
SQL
    fi
    psql_ -c CHECKPOINT
}

# Occurrences per second of one drain of `table` by `script`.
drain() {
    local script=$1 table=$2 started completed last
    started=$(date +%s%3N)
    PGOPTIONS="$PGOPTIONS -c search_path=exp_cost -c synchronous_commit=on" \
        pgbench -n -M simple -c 8 -j 2 -t $(( N / 4000 + 5 )) -D seqs={} -D ids={} -D epochs={} \
        -f "$script" "$DB" > "$work/pgbench.out" 2>&1 \
        || { cat "$work/pgbench.out" >&2; exit 1; }
    read -r completed last < <(psql -qAt -F ' ' "$DB" \
        -c "SELECT count(*), max(finished_at) FROM exp_cost.$table WHERE state = 'SUCCEEDED'")
    if [ "$completed" != "$N" ]; then
        echo "$script completed $completed of $N" >&2; cat "$work/pgbench.out" >&2; exit 1
    fi
    echo "$N * 1000 / ($last - $started)" | bc -l
}

for r in $(seq "$ROUNDS"); do
    setup ceiling
    c=$(drain "$here/ceiling.sql" ceiling)
    printf 'round %s: ceiling %.0f/s' "$r" "$c"
    for st in $STEPS; do
        setup store
        step "$st"
        s=$(drain "$work/$st.sql" occurrences)
        printf '  %s %.0f/s (%.2f)' "$st" "$s" "$(echo "$s / $c" | bc -l)"
    done
    echo
done
