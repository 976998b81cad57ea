#!/usr/bin/env bash
# Resumed download: total bytes the server sends for a 100 MiB artifact over a link that drops 5 times (each of the
# first 5 responses cut at a random point, 2–18 % of the artifact into its body), through the updater's production
# path (the fleet-fetch helper as the agent user, the updater side appending to its partial download and verifying
# the SHA-256 of the whole), resuming with HTTP Range, next to the same drops with every try starting from zero
# (the reference: what the updater did before resuming), both in the same run against the fleet-rig HTTPS server.
# FLEET_BENCH_SEED picks the cut points (printed); FLEET_BENCH_DROPS the number of drops.
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
