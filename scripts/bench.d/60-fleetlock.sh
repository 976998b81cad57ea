#!/usr/bin/env bash
# FleetLock server: lock + unlock pairs/s and p99 latency with 50 concurrent clients (enough slots for all), for the
# file store (real fsync, group commit) over HTTP and over HTTPS (private CA, verified) and the NATS KV store with 3
# replicas; reference: one fsync per request.
# Goals: file store >= 5,000 pairs/s with p99 <= 20 ms; NATS store >= 1,000 pairs/s; zero errors.
# Then refused requests (a host flooding the server with ids it does not hold): N pre-reboots from N distinct ids against a held slot on the NATS store (3-node
# cluster, bucket with 3 copies), and a restart after them. Goals: the bucket holds at most the holder + 2 keys,
# restart to healthy <= 1,000 ms, >= 5,000 refusals/s, zero errors. N: FLEET_BENCH_REFUSALS (default 200,000).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -p fleetlock-server --bin fleetlock-server --example fleetlock_bench >&2
target=${CARGO_TARGET_DIR:-$root/target}
bench=$target/release/examples/fleetlock_bench
server=$target/release/fleetlock-server
# A directory on the real disk (not tmpfs), so fsync costs what it costs on a device.
dir=${FLEET_CACHE:-$root/.cache}/bench-fleetlock
rm -rf "$dir"; mkdir -p "$dir"
. "$root/scripts/bench.d/lib/goal.sh"
echo "| setup | clients | pairs/s | p99 pair (ms) | p99 request (ms) | requests per commit | errors | result |"
echo "|---|---|---|---|---|---|---|---|"
echo "$("$bench" --store fsync-reference --dir "$dir" --seconds 3) — |"
# row LABEL MIN_PAIRS MAX_P99 ARGS...: one measured row with its goals judged (MAX_P99 - : no latency goal).
row() {
  local label=$1 min=$2 p99=$3 line cells
  shift 3
  line=$("$bench" "$@")
  IFS='|' read -ra cells <<<"$line"
  local v="pairs/s $(goal "$label: pairs/s" "$(number "${cells[3]}")" ">=" "$min")"
  [ "$p99" = - ] || v+="; p99 $(goal "$label: p99 pair (ms)" "$(number "${cells[4]}")" "<=" "$p99" "$p99 ms")"
  echo "$line $v; $(errors "$label" "$(number "${cells[7]}")") |"
}
row "file store, HTTP" 5000 20 --store file --bin "$server" --dir "$dir" --clients 50 --seconds 5
row "file store, HTTPS" 5000 20 --store file --bin "$server" --dir "$dir" --clients 50 --seconds 5 --https
row "NATS store, 3 replicas" 1000 - --store nats --bin "$server" --dir "$dir" --clients 50 --seconds 5 --replicas 3
echo
echo "Goals: file store >= 5000 pairs/s with p99 pair <= 20 ms (HTTP and HTTPS); NATS store (3 replicas) >= 1000 pairs/s;"
echo "0 errors."
echo
echo "| refused pre-reboots | clients | refused/s | bucket keys after | restart to healthy (ms) | errors | result |"
echo "|---|---|---|---|---|---|---|"
label="refusals"
line=$("$bench" --store refusals --bin "$server" --dir "$dir" --clients 16 --count "${FLEET_BENCH_REFUSALS:-200000}")
IFS='|' read -ra cells <<<"$line"
v="refused/s $(goal "$label: refused/s" "$(number "${cells[3]}")" ">=" 5000)"
v+="; keys $(goal "$label: bucket keys" "$(number "${cells[4]}")" "<=" 3 "3 (the holder + 2)")"
v+="; restart $(goal "$label: restart (ms)" "$(number "${cells[5]}")" "<=" 1000 "1000 ms")"
echo "$line $v; $(errors "$label" "$(number "${cells[6]}")") |"
echo
echo "Goals: refused requests store nothing (at most the holder + 2 keys: its group and the group directory), a restart"
echo "after them is healthy within 1 s, >= 5000 refusals/s; 0 errors."
rm -rf "$dir"
