#!/usr/bin/env bash
# Debian's Chromium: the dashboard tests load every page in headless Chromium (--dump-dom, --screenshot).
set -euo pipefail
if dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  echo "chromium present"; exit 0
fi
echo "installing: chromium"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
