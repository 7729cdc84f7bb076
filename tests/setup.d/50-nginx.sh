#!/usr/bin/env bash
# nginx for the TLS-termination test (tests/node/test_deploy_tls.py runs deploy/nginx.conf
# in front of a real node). Idempotent: installs the Debian package only when missing.
set -euo pipefail
if [ -x /usr/sbin/nginx ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1 \
    || $SUDO apt-get install -y -qq --no-install-recommends nginx >/dev/null
/usr/sbin/nginx -v
