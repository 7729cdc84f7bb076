#!/usr/bin/env bash
# Start a throwaway offline js-ipfs daemon on free 127.0.0.1 ports; print its API multiaddr.
# Usage: tests/ipfs/start.sh DIR      (stop it with: tests/ipfs/stop.sh DIR)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../../.venv/bin/python}"
[ -x "$py" ] || py=python3
exec "$py" "$here/daemon.py" start "${1:?usage: start.sh DIR}"
