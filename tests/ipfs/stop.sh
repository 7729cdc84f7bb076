#!/usr/bin/env bash
# Stop the daemon that tests/ipfs/start.sh DIR started, by its recorded PID.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../../.venv/bin/python}"
[ -x "$py" ] || py=python3
exec "$py" "$here/daemon.py" stop "${1:?usage: stop.sh DIR}"
