#!/usr/bin/env bash
# Download + verify of a 100 MiB artifact over loopback HTTPS through the updater's production path (the fleet-fetch
# helper as the agent user: ureq + rustls, streaming SHA-256, into a pipe; the updater side re-hashes, writes the temp
# file and fsyncs) against `curl -s --cacert … URL | sha256sum`, both from the same rustls test server (fleet-rig,
# via the fetch_bench example), alternating, 3 rounds each; and the peak RSS (VmHWM) of both processes.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
rounds=${FLEET_BENCH_ROUNDS:-3}
cargo build --release --locked -q -p fleet-updater --example fetch_bench --bin fleet-tools
bin=${CARGO_TARGET_DIR:-$root/target}/release/examples/fetch_bench
getent passwd fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null
for tool in curl sha256sum /usr/bin/time; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: run scripts/setup" >&2; exit 1; }
done

work=$(mktemp -d /tmp/fleet-bench-download.XXXXXX)
chmod 755 "$work" # the helper runs as fleet-agent and must reach its copy here
# fleet-fetch is a name of the multicall fleet-tools.
cp "${CARGO_TARGET_DIR:-$root/target}/release/fleet-tools" "$work/fleet-fetch"
server_pid=
cleanup() {
  exec 9>&- 2>/dev/null || true
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

size=$((100 * 1024 * 1024))
head -c "$size" /dev/urandom > "$work/agent.bin"
sha=$(sha256sum "$work/agent.bin" | cut -d' ' -f1)
mkdir "$work/tmp"
mkfifo "$work/stdin"
"$bin" serve "$work/agent.bin" "$work/ca.pem" < "$work/stdin" > "$work/url" &
server_pid=$!
exec 9>"$work/stdin" # the server runs until this closes
for _ in $(seq 100); do [ -s "$work/url" ] && break; sleep 0.1; done
url=$(cat "$work/url")
[ -n "$url" ] || { echo "the benchmark server did not start" >&2; exit 1; }

now() { date +%s%N; }
fetch_ms=() curl_ms=() rss=() helper_rss=() curl_rss=()
for _ in $(seq "$rounds"); do
  t0=$(now)
  out=$("$bin" fetch "$url" "$sha" "$work/ca.pem" "$work/tmp" "$work/fleet-fetch")
  t1=$(now)
  fetch_ms+=($(( (t1 - t0) / 1000000 )))
  rss+=("$(sed -n 's/.*vmhwm_kib=\([0-9]*\).*/\1/p' <<<"$out")")
  helper_rss+=("$(sed -n 's/.*helper_kib=\([0-9]*\).*/\1/p' <<<"$out")")
  t0=$(now)
  got=$( { /usr/bin/time -f %M -o "$work/curl.rss" curl -sS --fail --cacert "$work/ca.pem" "$url"; } | sha256sum | cut -d' ' -f1)
  t1=$(now)
  [ "$got" = "$sha" ] || { echo "curl | sha256sum computed $got, expected $sha" >&2; exit 1; }
  curl_ms+=($(( (t1 - t0) / 1000000 )))
  curl_rss+=("$(tail -n1 "$work/curl.rss")")
done
[ -z "$(ls -A "$work/tmp")" ] || { echo "fetch left files in its temp dir" >&2; exit 1; }

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
fm=$(median "${fetch_ms[@]}"); cm=$(median "${curl_ms[@]}")
maxrss=$(printf '%s\n' "${rss[@]}" | sort -n | tail -n1)
maxhelper=$(printf '%s\n' "${helper_rss[@]}" | sort -n | tail -n1)
maxcurl=$(printf '%s\n' "${curl_rss[@]}" | sort -n | tail -n1)
mibs() { awk -v ms="$1" 'BEGIN { printf "%.0f", 100 / (ms / 1000) }'; }
ratio=$(awk -v f="$fm" -v c="$cm" 'BEGIN { printf "%.2f", c / f }')
under8() { goal "$1 (KiB)" "$2" "<" 8192 "8 MiB"; }

echo "100 MiB over loopback HTTPS (TLS 1.3, same rustls server for both), median of $rounds alternating rounds."
echo "fetch: process start to exit incl. starting the helper, system roots, SHA-256 on both sides, temp file write"
echo "and fsync; curl: pipeline wall time."
echo
echo "| measure | fleet-updater fetch (helper + updater side) | curl \\| sha256sum | result |"
echo "|---|---|---|---|"
echo "| time (ms), runs: ${fetch_ms[*]} / ${curl_ms[*]} | $fm | $cm | |"
echo "| throughput (MiB/s) | $(mibs "$fm") | $(mibs "$cm") | fetch = ${ratio}× curl: $(goal "fetch throughput / curl (×)" "$ratio" ">=" 0.9 "0.9×") |"
echo "| peak RSS, updater side (KiB, max of runs) | $maxrss | $maxcurl (curl alone) | $(under8 "peak RSS, updater side" "$maxrss") |"
echo "| peak RSS, fleet-fetch helper (KiB, max of runs) | $maxhelper | | $(under8 "peak RSS, fleet-fetch helper" "$maxhelper") |"
