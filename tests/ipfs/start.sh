#!/usr/bin/env bash
# Start a throwaway js-ipfs daemon on 127.0.0.1; print its API multiaddr.
# Usage: tests/ipfs/start.sh DIR [--api-port N] [--online]
#   ports default to free ones; fixed ones let a merklog config name the daemon for good,
#   and starting again on the same DIR keeps its repo and ports.
#   (stop it with: tests/ipfs/stop.sh DIR)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../../.venv/bin/python}"
[ -x "$py" ] || py=python3
exec "$py" "$here/daemon.py" start "${1:?usage: start.sh DIR [--api-port N] [--online]}" "${@:2}"
