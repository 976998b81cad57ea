#!/usr/bin/env bash
# fleet-updater idle memory: resident set size of the release build, idle after start-up and again after serving
# 200 status requests, side by side with `sleep` (the smallest possible process) measured in the same run.
# Goal: idle RSS <= 3 MiB. PSS and anonymous memory show how much of the RSS is the shared C library.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/release/fleet-updater
if [ ! -x "$bin" ]; then
  (cd "$root" && cargo build --release -p fleet-updater --locked >&2)
fi
getent group fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

printf 'root = "%s"\n' "$work/root" >"$work/updater.toml"
mkdir -p "$work/root"
RUST_LOG=warn "$bin" --config "$work/updater.toml" 2>"$work/updater.log" &
upid=$!; pids+=("$upid")
sock=$work/root/run/fleet-updater/updater.sock
for _ in $(seq 1 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { echo "fleet-updater did not open its socket:" >&2; cat "$work/updater.log" >&2; exit 1; }
sleep infinity & spid=$!; pids+=("$spid")
sleep 1

kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }
# Proportional set size and anonymous memory: RSS counts shared libc pages in full (a `sleep` has most of it).
roll() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/smaps_rollup"; }
mib() { awk -v x="$1" 'BEGIN {printf "%.2f MiB", x / 1024}'; }

u_idle=$(kib "$upid" VmRSS); s_idle=$(kib "$spid" VmRSS)
u_pss=$(roll "$upid" Pss); s_pss=$(roll "$spid" Pss)
u_anon=$(roll "$upid" Anonymous); s_anon=$(roll "$spid" Anonymous)
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
u_after=$(kib "$upid" VmRSS); u_peak=$(kib "$upid" VmHWM); s_peak=$(kib "$spid" VmHWM)

echo "| measurement | fleet-updater | reference: \`sleep\` | goal |"
echo "|---|---|---|---|"
echo "| idle RSS after start-up | $(mib "$u_idle") | $(mib "$s_idle") | ≤ 3 MiB |"
echo "| idle RSS after 200 status requests | $(mib "$u_after") | $(mib "$s_idle") | ≤ 3 MiB |"
echo "| peak RSS (VmHWM) | $(mib "$u_peak") | $(mib "$s_peak") | — |"
echo "| idle PSS (shared pages divided among their users) | $(mib "$u_pss") | $(mib "$s_pss") | — |"
echo "| idle anonymous memory (heap, stacks) | $(mib "$u_anon") | $(mib "$s_anon") | — |"
