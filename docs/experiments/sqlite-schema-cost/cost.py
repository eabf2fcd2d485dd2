#!/usr/bin/env python3
"""What the store's SQLite schema costs a claim + complete, apart from the store's code.

The loop of `campanile bench ceiling` on SQLite (one connection; each transaction completes
the batch held, one fenced UPDATE per row, and claims the next 1,000 due or lease-expired rows,
oldest first, in one UPDATE), run on the ceiling's 12-column table with its statements, on the
`occurrences` table that `campanile migrate` creates with the store's claim and success in the
same shape, and on variants of that table. Same pragmas as the store's writer. Variants
alternate within each round.

    python3 cost.py [ROUNDS] [CAMPANILE_BINARY]
"""

import os
import pathlib
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

N, BATCH = 100_000, 1000
PRAGMAS = """PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY;
             PRAGMA cache_size = -8192; PRAGMA mmap_size = 1073741824;"""

# The ceiling's table and statements, read from crates/bench/src/ceiling.rs (its `SCHEMA`,
# `SQLITE_CLAIM` and the SQLite completion), the table renamed.
RUST = (pathlib.Path(__file__).resolve().parent / "../../../crates/bench/src/ceiling.rs").read_text()


def rust_str(start, end='"'):
    """The Rust string literal of ceiling.rs that begins at `start`, up to `end`."""
    i = RUST.index(start)
    return re.sub(r"\bceiling\b", "occurrences", RUST[i:RUST.index(end, i)])


CEILING = rust_str("CREATE TABLE ceiling (")
CEILING_CLAIM = rust_str("UPDATE ceiling SET state = 'RUNNING'")
CEILING_DONE = rust_str("UPDATE ceiling SET state = 'SUCCEEDED'")

# The store's claim and success writes, in the shape of the ceiling's: the candidates of
# crates/store-sqlite/src/sql/pending_due_range.sql and expired_leases.sql (one queue of one
# tenant at priority 0) folded into the `UPDATE` of claim.rs `claim_rows`, with its columns,
# and the success `UPDATE` of finish.rs (`by_number`). The store reads its candidates first
# and then updates them by number; here one statement does both, as in the ceiling.
STORE_CLAIM = """
UPDATE occurrences
   SET state = 'RUNNING', owner = 'w', epoch = epoch + 1, attempts = attempts + 1,
       lease_until = ?1 + COALESCE(60000, lease_ms), claimed_at = ?1, cancel_requested = 0,
       ran_until = NULL, claim_key = NULL,
       available_at = CASE WHEN state = 'RUNNING' THEN MAX(available_at, lease_until)
                           ELSE available_at END
 WHERE seq IN (
       SELECT seq FROM (
           SELECT * FROM (SELECT seq, available_at AS at FROM occurrences INDEXED BY occurrences_pending
                           WHERE tenant_id = 1 AND queue = 'bench' AND state IN ('READY', 'RETRY_WAIT')
                             AND overlap = 0 AND priority = 0 AND available_at <= ?1
                           ORDER BY available_at LIMIT ?2)
           UNION ALL
           SELECT * FROM (SELECT seq, lease_until AS at FROM occurrences INDEXED BY occurrences_running
                           WHERE tenant_id = 1 AND queue = 'bench' AND state = 'RUNNING'
                             AND lease_until <= ?1 AND attempts < max_attempts
                             AND cancel_requested = 0 AND overlap = 0
                           ORDER BY lease_until LIMIT ?2))
        ORDER BY at LIMIT ?2)
RETURNING seq, epoch, id"""
SLIM_CLAIM = STORE_CLAIM.replace("tenant_id = 1 AND queue = 'bench' AND ", "").replace(
    "AND priority = 0 ", "")
STORE_DONE = """
UPDATE occurrences SET state = 'SUCCEEDED', result = COALESCE('true', result), finished_at = ?4,
       ran_until = ?4
 WHERE seq = ?1 AND id = ?5 AND tenant_id = 1 AND state = 'RUNNING' AND owner = ?2
   AND epoch = ?3 AND lease_until > ?4"""

CONSTRAINED = ["occurrences_pending_constrained", "occurrences_running_schedule",
               "occurrences_ran_constrained_schedule", "occurrences_pending_constrained_schedule"]
SLIM_KEYS = """
DROP INDEX occurrences_pending; DROP INDEX occurrences_running;
CREATE INDEX occurrences_pending ON occurrences (available_at)
    WHERE state IN ('READY', 'RETRY_WAIT') AND overlap = 0;
CREATE INDEX occurrences_running ON occurrences (lease_until) WHERE state = 'RUNNING';"""
# Columns a claim and a success neither read nor write, and no index names.
COLD = ["backoff_initial_ms", "backoff_max_ms", "last_error_class", "last_error", "created_at",
        "due_at", "origin", "payload"]
NARROW = ("DROP TRIGGER occurrences_payload_set; DROP TRIGGER occurrences_payload_gone;"
          + "".join(f"ALTER TABLE occurrences DROP COLUMN {c};" for c in COLD))

DROP_CONSTRAINED = "".join(f"DROP INDEX {i};" for i in CONSTRAINED)
# (name, change to the migrated table or None for the ceiling's, claim, success)
VARIANTS = [
    ("ceiling", None, CEILING_CLAIM, CEILING_DONE),
    ("store", "", STORE_CLAIM, STORE_DONE),
    ("store without the 4 overlap-constrained indexes", DROP_CONSTRAINED, STORE_CLAIM, STORE_DONE),
    ("store with the ceiling's index keys", SLIM_KEYS, SLIM_CLAIM, STORE_DONE),
    (f"store without the {len(COLD)} columns neither write uses", NARROW, STORE_CLAIM, STORE_DONE),
    ("store with the ceiling's index keys and without those columns", SLIM_KEYS + NARROW,
     SLIM_CLAIM, STORE_DONE),
    ("store with all three", DROP_CONSTRAINED + SLIM_KEYS + NARROW, SLIM_CLAIM, STORE_DONE),
]


def fresh(path):
    for s in ("", "-wal", "-shm"):
        if os.path.exists(path + s):
            os.remove(path + s)


def setup(work, template, change):
    path = os.path.join(work, "v.db")
    fresh(path)
    if change is not None:
        shutil.copy(template, path)
    c = sqlite3.connect(path, isolation_level=None)
    c.executescript(PRAGMAS)
    c.executescript(CEILING if change is None else change)
    now, schedule = int(time.time() * 1000), uuid.uuid4().bytes
    rows = ((uuid.uuid4().bytes, schedule, now - 1 - i) for i in range(N))
    c.execute("BEGIN")
    if change is None:
        c.executemany("INSERT INTO occurrences (id, schedule_id, version, scheduled_for, "
                      "available_at, state) VALUES (?1, ?2, 1, ?3, ?3, 'READY')", rows)
    else:
        cols = {r[1] for r in c.execute("PRAGMA table_info(occurrences)")}
        extra = [c_ for c_ in ("max_attempts", "backoff_initial_ms", "backoff_max_ms",
                               "created_at", "origin") if c_ in cols]
        values = {"max_attempts": "3", "backoff_initial_ms": "1000", "backoff_max_ms": "60000",
                  "created_at": "?3", "origin": "'schedule'"}
        c.executemany(
            "INSERT INTO occurrences (id, tenant_id, schedule_id, version, scheduled_for, "
            "available_at, queue, priority, state" + "".join(", " + e for e in extra) + ") "
            "VALUES (?1, 1, ?2, 1, ?3, ?3, 'bench', 0, 'READY'"
            + "".join(", " + values[e] for e in extra) + ")", rows)
    c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return c


def drain(c, claim, done_sql):
    held, done, started = [], 0, time.perf_counter()
    while True:
        now = int(time.time() * 1000)
        c.execute("BEGIN IMMEDIATE")
        if held:
            done += c.executemany(done_sql, ((r[0], "w", r[1], now, *r[2:]) for r in held)).rowcount
        held = c.execute(claim, (now, BATCH)).fetchall()
        c.execute("COMMIT")
        if not held:
            break
    secs = time.perf_counter() - started
    if done != N:
        raise SystemExit(f"completed {done} of {N}")
    return N / secs


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    binary = sys.argv[2] if len(sys.argv) > 2 else "campanile"
    with tempfile.TemporaryDirectory() as work:
        template = os.path.join(work, "migrated.db")
        subprocess.run([binary, "migrate", "--database", template], check=True,
                       stdout=subprocess.DEVNULL)
        t = sqlite3.connect(template)
        t.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        t.execute("PRAGMA journal_mode = DELETE")
        t.close()
        rates = {name: [] for name, *_ in VARIANTS}
        for _ in range(rounds):
            for name, change, claim, done_sql in VARIANTS:
                c = setup(work, template, change)
                rates[name].append(drain(c, claim, done_sql))
                c.close()
        base = statistics.median(rates["ceiling"])
        for name, xs in rates.items():
            m = statistics.median(xs)
            print(f"{name:62} {' '.join(f'{x / 1000:6.1f}k' for x in xs)}   "
                  f"median {m / 1000:6.1f}k/s  {m / base:.2f} of the ceiling")


if __name__ == "__main__":
    main()
