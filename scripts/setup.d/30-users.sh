#!/usr/bin/env bash
# The `fleet-agent` system user and group: the agent runs as it, the updater's socket is group `fleet-agent`, and
# the updater runs a candidate's `--self-test` probe as it (the updater's probe tests need it on the host too).
set -euo pipefail
if ! getent group fleet-agent >/dev/null; then
  groupadd --system fleet-agent
fi
if ! getent passwd fleet-agent >/dev/null; then
  useradd --system --gid fleet-agent --home-dir /var/lib/fleet-agent --create-home \
    --shell /usr/sbin/nologin --comment "Harmony Fleet agent" fleet-agent
fi
id fleet-agent
