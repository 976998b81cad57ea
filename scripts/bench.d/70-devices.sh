#!/usr/bin/env bash
# Whole-device benchmarks: the cutover gap of an agent upgrade on an nspawn device (old agent stopped → new agent
# READY, idle drain; reference: a plain `systemctl restart` of the same agent in the same run), and the stripped
# sizes of the device profile (scripts/cross-build: release, for size, panic = abort) for aarch64 (Raspberry Pi OS)
# next to x86_64.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
export FLEET_CACHE=${FLEET_CACHE:-$root/.cache}
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
target=${CARGO_TARGET_DIR:-$root/target}

cargo build --quiet --locked -p fleet-vm-tests --bin cutover-bench
cutover=$("$target/debug/cutover-bench")
echo "$cutover"
# cutover-bench judges its own goal row ("met" / "NOT met"); a miss goes into the summary.
{ grep -F 'NOT met' <<<"$cutover" || true; } | while IFS='|' read -r _ label value _; do
  goal_missed "$(trim "$label"): $(trim "$value"), goal ≤ 1500 ms"
done
grep -qE '\| (met|NOT met) \|$|: (met|NOT met) \|$' <<<"$cutover" || goal_missed "cutover-bench printed no judged goal row"
echo

scripts/cross-build >"$target/cross-build.log" 2>&1 || { tail -20 "$target/cross-build.log" >&2; exit 1; }
size() { awk -F'|' -v t="$1" -v b="$2" '$2 ~ t && $3 ~ b {gsub(/ /, "", $4); print $4}' "$target/dist/sizes.md"; }
mib() { awk -v b="$1" 'BEGIN{printf "%.2f MiB", b/1048576}'; }
a_agent=$(size aarch64 fleet-agent); a_upd=$(size aarch64 fleet-updater); a_tools=$(size aarch64 fleet-tools)
x_agent=$(size x86_64 fleet-agent); x_upd=$(size x86_64 fleet-updater); x_tools=$(size x86_64 fleet-tools)
echo "| stripped binary (device profile) | aarch64 (Raspberry Pi OS) | x86_64 (reference) | goal (aarch64) |"
echo "|---|---|---|---|"
echo "| fleet-agent | $(mib "$a_agent") | $(mib "$x_agent") | $(goal "aarch64 fleet-agent, device profile (bytes)" "$a_agent" "<=" 5242880 "5 MiB") |"
echo "| fleet-updater | $(mib "$a_upd") | $(mib "$x_upd") | |"
echo "| fleet-tools (multicall: fleet-fetch, the updater's download helper; fleet-reboot; fleet-token; fleet-boot-watchdog) | $(mib "$a_tools") | $(mib "$x_tools") | |"
echo "| updater total (fleet-updater + fleet-tools) | $(mib $((a_upd + a_tools))) | $(mib $((x_upd + x_tools))) | $(goal "aarch64 fleet-updater + fleet-tools, device profile (bytes)" $((a_upd + a_tools)) "<=" 4194304 "4 MiB") |"
