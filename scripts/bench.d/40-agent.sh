#!/usr/bin/env bash
# fleet-agent: idle RSS, CPU time and wake-ups per idle minute with 10 workloads (agent and updater next to
# nats-server), again with 5 of the 10 health-checked by the agent (3 HTTP, 2 TCP probes every 30 s; then, for
# information, 2 of them command checks run through Podman's API), desired-state put → container running with its
# step breakdown (10 and 50 unchanged workloads present) against `podman run -d` in the same run, the same for a
# private image (htpasswd registry over TLS, credentials from device-secrets) against `podman run -d --authfile` (after `podman login`), 50 workloads at
# once against fifty sequential `podman run -d`, and the stripped binary size. The agent and the updater measured
# are the `device` profile builds (what scripts/package and scripts/cross-build ship: Cargo.toml [profile.device]);
# the benchmark harness itself is a release build. Uses real nats-server, rootful Podman and fleet-updater (test-rig.md).
# FLEET_BENCH_IDLE_SECS sets the idle window (default 60), FLEET_BENCH_HEALTH_INTERVAL the checks' interval (30).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --profile device -p fleet-agent -p fleet-updater --locked >/dev/null 2>&1 ||
  cargo build --profile device -p fleet-agent -p fleet-updater --locked
getent group fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null
export FLEET_AGENT_BIN=$target/device/fleet-agent FLEET_UPDATER_BIN=$target/device/fleet-updater
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The harness names the binary it measures a "release binary"; here it is the device profile's.
RUST_LOG=${RUST_LOG:-warn} cargo run --release -q -p fleet-agent --example agent-bench |
  sed 's/stripped release binary/stripped binary, device profile/' | tee "$out"

# The goals the tables above state, judged.
ratios=$(awk -F'|' '/^\| ratio \(goal/ { gsub(/[ ×]/, "", $3); print $3 }' "$out")
fifty=$(grep -F '50 workloads placed at once' "$out" | grep -oE '\([0-9.]+×\)' | tr -d '()×' | head -n1 || true)
# The idle table's row of daemon $1 (five cells, first cell exactly the name): `cell` would match the first
# table's header, which names fleet-agent too.
wakes() {
  awk -F'|' -v n="$1" '$2 == " " n " " && NF == 7 { c = $6; gsub(/^ +| +$/, "", c); print c; exit }' "$out"
}
echo
echo "| goal (device profile builds) | measured | result |"
echo "|---|---|---|"
rss=$(number "$(cell "$out" "idle RSS with 10 workloads" 2)")
echo "| fleet-agent idle RSS with 10 workloads | $rss MiB | $(goal "fleet-agent idle RSS with 10 workloads (MiB)" "$rss" "<=" 6 "6 MiB") |"
rss=$(number "$(cell "$out" "idle RSS with 10 workloads, 5 with health checks" 2)")
echo "| fleet-agent idle RSS with 10 workloads, 5 with health checks | $rss MiB | $(goal "fleet-agent idle RSS with 10 workloads, 5 health-checked (MiB)" "$rss" "<=" 6 "6 MiB") |"
size=$(number "$(cell "$out" "stripped binary, device profile" 2)")
echo "| fleet-agent stripped binary ($(uname -m)) | $size MiB | $(goal "fleet-agent stripped binary (MiB)" "$size" "<=" 6 "6 MiB") |"
echo "| 50 workloads at once / fifty sequential \`podman run -d\` | ${fifty}× | $(goal "50 workloads at once / podman (×)" "$fifty" "<=" 1.2 "1.2×") |"
n=0
for r in $ratios; do
  n=$((n + 1))
  # The third breakdown is the private image's, against `podman run -d --authfile` (after `podman login`).
  what="\`podman run -d\`, breakdown $n"
  [ "$n" -eq 3 ] && what="\`podman run -d --authfile\`, private image (breakdown 3)"
  echo "| put → running / $what | ${r}× | $(goal "put → running / podman, breakdown $n (×)" "$r" "<=" 1.2 "1.2×") |"
done
[ "$n" -gt 0 ] || goal_missed "no put → running ratio rows in the output"
for d in fleet-agent fleet-updater "fleet-agent, 5 health checks"; do
  w=$(wakes "$d")
  label=$d
  [ "$d" = "fleet-agent, 5 health checks" ] && label="fleet-agent with 5 of 10 workloads health-checked"
  echo "| $label idle wake-ups per second | $w | $(goal "$label idle wake-ups per second" "$w" "<=" 1 1) |"
done
