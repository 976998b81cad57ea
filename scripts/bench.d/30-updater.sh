#!/usr/bin/env bash
# fleet-updater idle memory: resident set size of the `device` profile build (what scripts/package and
# scripts/cross-build ship: Cargo.toml [profile.device]) with the release profile beside it, idle after start-up
# and again after serving 200 status requests, side by side with `sleep` (the smallest possible process) measured in
# the same run. Goal (device profile): idle RSS <= 3 MiB. PSS and anonymous memory show how much of the RSS is the
# shared C library.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$root/scripts/bench.d/lib/goal.sh"
target=${CARGO_TARGET_DIR:-$root/target}
(cd "$root" && cargo build --release -p fleet-updater --bin fleet-updater --locked -q >&2)
(cd "$root" && cargo build --profile device -p fleet-updater --bin fleet-updater --locked -q >&2)
getent group fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
# Proportional set size and anonymous memory: RSS counts shared libc pages in full (a `sleep` has most of it).
roll() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/smaps_rollup"; }
mib() { awk -v x="$1" 'BEGIN {printf "%.2f MiB", x / 1024}'; }

# measure PROFILE: starts that build, measures it idle, after 200 status requests, and stops it; sets
# idle_PROFILE after_PROFILE peak_PROFILE pss_PROFILE anon_PROFILE (KiB).
measure() {
  local profile=$1 bin=$target/$1/fleet-updater dir=$work/$1
  mkdir -p "$dir/root"
  printf 'root = "%s"\n' "$dir/root" >"$dir/updater.toml"
  RUST_LOG=warn "$bin" --config "$dir/updater.toml" 2>"$dir/updater.log" &
  local upid=$!; pids+=("$upid")
  local sock=$dir/root/run/fleet-updater/updater.sock
  for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || { echo "fleet-updater ($profile) did not open its socket:" >&2; cat "$dir/updater.log" >&2; exit 1; }
  sleep 1
  printf -v "idle_$profile" %s "$(kib "$upid" VmRSS)"
  printf -v "pss_$profile" %s "$(roll "$upid" Pss)"
  printf -v "anon_$profile" %s "$(roll "$upid" Anonymous)"
  python3 - "$sock" <<'PY'
import socket, sys
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(b'{"protocol":1,"request":{"op":"status"}}\n')
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    assert b'"kind":"status"' in data, data
    s.close()
PY
  sleep 1
  printf -v "after_$profile" %s "$(kib "$upid" VmRSS)"
  printf -v "peak_$profile" %s "$(kib "$upid" VmHWM)"
  kill "$upid"; wait "$upid" 2>/dev/null || true
}

measure device
measure release
sleep infinity & spid=$!; pids+=("$spid")
sleep 1
s_idle=$(kib "$spid" VmRSS) s_pss=$(roll "$spid" Pss) s_anon=$(roll "$spid" Anonymous) s_peak=$(kib "$spid" VmHWM)
mibn() { awk -v x="$1" 'BEGIN {printf "%.2f", x / 1024}'; }

echo "| measurement | fleet-updater, device profile (shipped) | release profile | reference: \`sleep\` | goal (device profile) |"
echo "|---|---|---|---|---|"
echo "| idle RSS after start-up | $(mib "$idle_device") | $(mib "$idle_release") | $(mib "$s_idle") | $(goal "idle RSS after start-up (MiB)" "$(mibn "$idle_device")" "<=" 3 "3 MiB") |"
echo "| idle RSS after 200 status requests | $(mib "$after_device") | $(mib "$after_release") | $(mib "$s_idle") | $(goal "idle RSS after 200 status requests (MiB)" "$(mibn "$after_device")" "<=" 3 "3 MiB") |"
echo "| peak RSS (VmHWM) | $(mib "$peak_device") | $(mib "$peak_release") | $(mib "$s_peak") | — |"
echo "| idle PSS (shared pages divided among their users) | $(mib "$pss_device") | $(mib "$pss_release") | $(mib "$s_pss") | — |"
echo "| idle anonymous memory (heap, stacks) | $(mib "$anon_device") | $(mib "$anon_release") | $(mib "$s_anon") | — |"
