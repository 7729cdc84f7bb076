#!/usr/bin/env bash
# npm parts of the store interop tests: js-ipfs 0.66.1 (the real daemon) and ipfs-car.
# Idempotent: a stamp holding the lockfile's hash makes a second run a fast no-op.
set -euo pipefail
cd "$(dirname "$0")/../ipfs"

if ! command -v npm >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi

stamp=node_modules/.merklog-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x node_modules/.bin/jsipfs ]; then
    echo "ipfs test deps up to date"
    exit 0
fi
# Install scripts write their temporary files under TMPDIR: electron 1.8.8 (optional,
# see package.json) tries a download that fails offline and left an empty
# electron-tmp-download-* directory in /tmp after every install.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
TMPDIR=$scratch npm ci --no-audit --no-fund --loglevel=error
echo "$want" >"$stamp"
