#!/usr/bin/env bash
# The operator's dashboard at scale: overview, device, run history, run, release, deployment and reboots pages with 10,000
# Devices, a 100,000-device TaskRun plan and an AgentRelease and a FleetDeployment rolling out over every device
# (time and size per page as a client on the host sees them, operator RSS), next to listing the same CRs with
# kube's client and loading the whole plan from NATS, in the same run. Prints Markdown tables
# (operator/examples/dashboard_bench.rs), then judges every page against its goal (median under 100 ms).
# Needs scripts/setup's kube-apiserver.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -q -p fleet-operator --bin fleet-operator --example dashboard_bench
cargo build --release --locked -q -p fleetlock-server --bin fleetlock-server
target=${CARGO_TARGET_DIR:-$root/target}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
FLEET_OPERATOR_BIN=$target/release/fleet-operator FLEETLOCK_SERVER_BIN=$target/release/fleetlock-server \
  "$target/release/examples/dashboard_bench" | tee "$out"
# The pages: the first table's rows that are not references (a page's row starts with what it is, then its path).
pages=$(awk -F'|' '/^$/ { exit } /^\| / && !/^\| dashboard:/ && !/reference:/ { c = $2; gsub(/^ +| +$/, "", c); print c }' "$out")
echo
echo "| page | median | goal |"
echo "|---|---|---|"
if [ -z "$pages" ]; then
  goal_missed "the bench printed no page"
fi
while IFS= read -r page; do
  [ -n "$page" ] || continue
  ms=$(number "$(cell "$out" "| $page |" 2)")
  echo "| $page | ${ms:-—} ms | $(goal "$page" "$ms" "<" 100 "100 ms") |"
done <<<"$pages"
