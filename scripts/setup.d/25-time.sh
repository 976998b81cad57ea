#!/usr/bin/env bash
# GNU time (/usr/bin/time): peak RSS of the curl reference in scripts/bench.d/20-download.sh.
set -euo pipefail
if dpkg-query -W -f='${Status}' time 2>/dev/null | grep -q "install ok installed"; then echo "time present"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends time >/dev/null
