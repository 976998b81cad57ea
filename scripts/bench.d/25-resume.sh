#!/usr/bin/env bash
# Resumed download: total bytes the server sends for a 100 MiB artifact over a link that drops 5 times (each of the
# first 5 responses cut at a random point, 2–18 % of the artifact into its body), through the updater's production
# path (the fleet-fetch helper as the agent user, the updater side appending to its partial download and verifying
# the SHA-256 of the whole), resuming with HTTP Range, next to the same drops with every try starting from zero
# (the reference: what the updater did before resuming), both in the same run against the fleet-rig HTTPS server.
# FLEET_BENCH_SEED picks the cut points (printed); FLEET_BENCH_DROPS the number of drops.
# Then the bandwidth cap (the updater's download_max_bytes_per_sec): a 20 MiB artifact under a 256 KiB/s cap, with
# the link holding and with it dropped at 10 MiB, through the same production path, next to curl --limit-rate 256k
# against the same server (the reference); the bytes received are sampled every 50 ms (the partial download's
# growth; curl's output file) and every 5-s window of them is checked against the cap.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
drops=${FLEET_BENCH_DROPS:-5}
seed=${FLEET_BENCH_SEED:-$(date +%s)}
mib=100
cargo build --release --locked -q -p fleet-updater --example fetch_bench --bin fleet-tools
bin=${CARGO_TARGET_DIR:-$root/target}/release/examples/fetch_bench
getent passwd fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null

work=$(mktemp -d /tmp/fleet-bench-resume.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work" # the helper runs as fleet-agent and must reach its copy here
# fleet-fetch is a name of the multicall fleet-tools.
cp "${CARGO_TARGET_DIR:-$root/target}/release/fleet-tools" "$work/fleet-fetch"
mkdir -m 700 "$work/partial"

out=$("$bin" resume "$mib" "$drops" "$seed" "$work/partial" "$work/fleet-fetch")
[ -z "$(ls -A "$work/partial")" ] || { echo "the fetch left files in its download dir" >&2; exit 1; }
field() { sed -n "s/.*mode=$1 .*$2=\([0-9.]*\).*/\1/p" <<<"$out"; }
size=$((mib * 1024 * 1024))
ratio() { awk -v b="$1" -v s="$size" 'BEGIN { printf "%.3f", b / s }'; }
mibs() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
r_bytes=$(field resume bytes_sent) z_bytes=$(field from-zero bytes_sent)
r_ratio=$(ratio "$r_bytes") z_ratio=$(ratio "$z_bytes")
verdict=$(goal "resumed bytes sent / artifact size (×)" "$r_ratio" "<=" 1.1 "1.1×")

echo "100 MiB artifact over loopback HTTPS, the link dropped $drops times (seed $seed); bytes the server sent in all."
echo "Both runs verify the SHA-256 of the whole artifact; pauses between tries shortened to 100 ms for the benchmark."
echo
echo "| measure | resumed (Range + If-Range) | every try from zero (reference) | result |"
echo "|---|---|---|---|"
echo "| bytes sent (MiB) | $(mibs "$r_bytes") | $(mibs "$z_bytes") | |"
echo "| × artifact size | $r_ratio | $z_ratio | resumed: $verdict |"
echo "| requests | $(field resume requests) | $(field from-zero requests) | |"
echo "| wall time (s) | $(field resume seconds) | $(field from-zero seconds) | |"

# The bandwidth cap.
cap=262144 cap_mib=20 drop_mib=10
expected=$(awk -v m="$cap_mib" -v c="$cap" 'BEGIN { printf "%.1f", m * 1048576 / c }')
lo=$(awk -v e="$expected" 'BEGIN { printf "%.1f", e * 0.9 }') hi=$(awk -v e="$expected" 'BEGIN { printf "%.1f", e * 1.1 }')
held=$("$bin" cap "$cap_mib" "$cap" 0 "$work/partial" "$work/fleet-fetch")
dropped=$("$bin" cap "$cap_mib" "$cap" "$drop_mib" "$work/partial" "$work/fleet-fetch")
[ -z "$(ls -A "$work/partial")" ] || { echo "the capped fetch left files in its download dir" >&2; exit 1; }
get() { sed -n "s/.*tool=$2 .*$3=\([0-9.]*\).*/\1/p" <<<"$1"; }
ratio5() { awk -v r="$1" -v c="$cap" 'BEGIN { printf "%.3f", r / c }'; }
kib() { awk -v r="$1" 'BEGIN { printf "%.1f", r / 1024 }'; }
declare -A v
for run in held dropped; do
  for tool in fleet-fetch curl; do
    out=${!run}
    v[$run.$tool.s]=$(get "$out" "$tool" seconds)
    v[$run.$tool.max]=$(ratio5 "$(get "$out" "$tool" max5s)")
    v[$run.$tool.min]=$(ratio5 "$(get "$out" "$tool" min5s)")
    v[$run.$tool.req]=$(get "$out" "$tool" requests)
    v[$run.$tool.mib]=$(mibs "$(get "$out" "$tool" bytes_sent)")
  done
done
t_held=$(goal "capped 20 MiB: wall time (s)" "${v[held.fleet-fetch.s]}" ">=" "$lo" "$lo")
t_held2=$(goal "capped 20 MiB: wall time (s)" "${v[held.fleet-fetch.s]}" "<=" "$hi" "$hi")
t_drop=$(goal "capped 20 MiB, link dropped: wall time (s)" "${v[dropped.fleet-fetch.s]}" ">=" "$lo" "$lo")
t_drop2=$(goal "capped 20 MiB, link dropped: wall time (s)" "${v[dropped.fleet-fetch.s]}" "<=" "$hi" "$hi")
w_held=$(goal "capped 20 MiB: highest 5-s window / cap" "${v[held.fleet-fetch.max]}" "<=" 1.10 "1.10×")
w_drop=$(goal "capped 20 MiB, link dropped: highest 5-s window / cap" "${v[dropped.fleet-fetch.max]}" "<=" 1.10 "1.10×")
r_drop=$(goal "capped 20 MiB, link dropped: MiB sent (resumed, not from zero)" "${v[dropped.fleet-fetch.mib]}" "<=" "$((cap_mib + 1))" "$((cap_mib + 1)) MiB")

echo
echo "$cap_mib MiB artifact over loopback HTTPS under a cap of $(kib "$cap") KiB/s ($cap bytes/s; $expected s at the cap), the link"
echo "holding, then dropped once at $drop_mib MiB (resumed after the production pause of 1 s). Rates are the bytes received"
echo "(sampled every 50 ms: the partial download's growth, curl's output file) over every 5-s window, / the cap."
echo
echo "| measure | fleet-fetch (download_max_bytes_per_sec = $cap) | curl --limit-rate $cap (reference) | result |"
echo "|---|---|---|---|"
echo "| link holds: wall time (s) | ${v[held.fleet-fetch.s]} | ${v[held.curl.s]} | $t_held, $t_held2 |"
echo "| link holds: highest 5-s window / cap | ${v[held.fleet-fetch.max]} | ${v[held.curl.max]} | $w_held |"
echo "| link holds: lowest 5-s window / cap | ${v[held.fleet-fetch.min]} | ${v[held.curl.min]} | |"
echo "| link dropped at $drop_mib MiB: wall time (s) | ${v[dropped.fleet-fetch.s]} | ${v[dropped.curl.s]} | $t_drop, $t_drop2 |"
echo "| link dropped: highest 5-s window / cap | ${v[dropped.fleet-fetch.max]} | ${v[dropped.curl.max]} | $w_drop |"
echo "| link dropped: lowest 5-s window / cap (the pause) | ${v[dropped.fleet-fetch.min]} | ${v[dropped.curl.min]} | |"
echo "| link dropped: requests / MiB sent | ${v[dropped.fleet-fetch.req]} / ${v[dropped.fleet-fetch.mib]} | ${v[dropped.curl.req]} / ${v[dropped.curl.mib]} | $r_drop |"
