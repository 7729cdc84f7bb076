#!/usr/bin/env bash
# Install everything the test suite needs, from a clean clone, then lint and test.
# Usage: bash tests/run.sh [pytest args...]    (MERKLOG_LONG=1 for the long/nightly mode)
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. System and npm parts that the real-component tests use (none needs the venv): run
#    beside step 2, as both mostly wait on disks and archives (npm ci ~1 minute, pip
#    ~1 minute); their output is shown once both are done.
setup_log=$(mktemp)
(
    for step in tests/setup.d/*.sh; do
        [ -e "$step" ] || continue
        echo "== setup: $step"
        bash "$step"
    done
) >"$setup_log" 2>&1 &
setup_pid=$!
trap 'kill "$setup_pid" 2>/dev/null || true; rm -f "$setup_log"' EXIT

# 2. Python environment (the project itself plus test extras).
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"

setup_ok=0
wait "$setup_pid" || setup_ok=$?
cat "$setup_log"
if [ "$setup_ok" != 0 ]; then
    echo "setup failed (exit $setup_ok)" >&2
    exit 1
fi

export SPARK_LOCAL_IP=127.0.0.1
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYTHONHASHSEED=0

# 3. Lint, then the tests: on two worker processes (pytest-xdist, ADR 0182), each test
#    module on one of them (its module fixtures made once); MERKLOG_TEST_WORKERS=0 runs
#    them in this process, one by one. The 25 slowest tests are listed at the end: the
#    whole run must stay under 20 minutes on two cores, and that list says where it goes.
.venv/bin/ruff check .
workers=${MERKLOG_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
    .venv/bin/python -m pytest --durations=25 "$@"
else
    .venv/bin/python -m pytest -n "$workers" --dist loadscope --durations=25 "$@"
fi
