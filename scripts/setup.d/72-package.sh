#!/usr/bin/env bash
# Debian packaging (scripts/package): dpkg-deb comes with dpkg-dev (20-apt.sh); lintian checks the packages.
set -euo pipefail
if dpkg-query -W -f='${Status}' lintian 2>/dev/null | grep -q "install ok installed"; then
  echo "lintian present"
  exit 0
fi
echo "installing: lintian"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends lintian >/dev/null
