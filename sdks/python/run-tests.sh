#!/usr/bin/env bash
# The Python SDK's tests, in a virtualenv of their own (sdks/python/.venv), against a real
# `campanile serve` the session starts: the binary at CAMPANILE_BIN (default
# target/debug/campanile; `cargo build -p campanile-cli` makes it), on SQLite, and on
# PostgreSQL too when CAMPANILE_TEST_PG_URL is set; first `mypy --strict` over the package and
# the tests. Arguments go to pytest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CAMPANILE_BIN="${CAMPANILE_BIN:-$repo/target/debug/campanile}"
test -x "$CAMPANILE_BIN" || {
  echo "no $CAMPANILE_BIN: run cargo build -p campanile-cli first, or set CAMPANILE_BIN" >&2
  exit 1
}
venv="$here/.venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[test]"
cd "$here"
"$venv/bin/python" -m mypy
exec "$venv/bin/python" -m pytest "$@"
