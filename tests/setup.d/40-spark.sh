#!/usr/bin/env bash
# Java 17 for the PySpark tests (local[2] session and the Spark Connect server, whose
# jars ship inside the pyspark wheel). Idempotent: installs only when no Java 17+ is found.
set -euo pipefail
if command -v java >/dev/null 2>&1; then
    major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
    if [ "${major:-0}" -ge 17 ]; then
        exit 0
    fi
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless
