#!/usr/bin/env python3
"""Prints WORKER_CLAIM (crates/store-postgres/src/sql/worker_claim.sql, read as it is now) as a
pgbench command: one claimer (owner w<client>, a lease of a minute, no claim key, an answer
bound of 8 MiB) of up to 1,000 occurrences of tenant 1's queue `bench` at `:now`, its answer
aggregated into the arrays `ids` and `epochs` that the next step completes."""

import pathlib
import re

here = pathlib.Path(__file__).resolve().parent
sql = (here / "../../../crates/store-postgres/src/sql/worker_claim.sql").read_text()
sql = "\n".join(line for line in sql.splitlines() if not line.startswith("--"))
params = {
    "1": "1::int8", "2": "'bench'::text", "3": ":now::int8", "4": "1000::int8",
    "5": "ARRAY['w:client_id']::text[]", "6": "ARRAY[60000]::int8[]",
    "7": "array_fill(1::int8, ARRAY[1000])", "8": "ARRAY[NULL]::uuid[]",
    "9": "ARRAY[8388608]::int8[]",
}
sql = re.sub(r"\$(\d)(?!\d)", lambda m: params[m.group(1)], sql)
answer = sql.rindex("SELECT c.id")
print(sql[:answer] + """SELECT
  COALESCE(array_agg(c.id ORDER BY c.available_at, c.seq) FILTER (WHERE c.id IS NOT NULL)::text, '{}') AS ids,
  COALESCE(array_agg(c.epoch ORDER BY c.available_at, c.seq) FILTER (WHERE c.id IS NOT NULL)::text, '{}') AS epochs
  FROM clk CROSS JOIN cst LEFT JOIN claimed c ON true \\gset""")
