#!/usr/bin/env bash
# Operator placement throughput vs raw NATS KV puts on the same server in the same run, and RSS at 10,000
# devices. Prints a Markdown table (operator/examples/operator_bench.rs).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -q -p fleet-operator --bin fleet-operator --example operator_bench \
  --example operator_bench_e2e
target=${CARGO_TARGET_DIR:-$root/target}
# 1. the placement write path against raw KV puts, same server, same run: FLEET_BENCH_RUNS rounds (default 5) of
#    raw puts / operator / operator with its desired-state watch, alternately first and last, into fresh buckets;
#    medians with ranges
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$target/release/examples/operator_bench" | tee "$out"
ratio=$(number "$(cell "$out" "ratio operator / raw, per run (goal" 2)")
echo
echo "| goal | measured | result |"
echo "|---|---|---|"
echo "| operator / raw KV puts (median) | $ratio | $(goal "placement keys/s, operator / raw (median)" "$ratio" ">=" 0.5) |"
echo
# 2. the real binary against a real kube-apiserver with 10,000 Devices (needs scripts/setup's kube-apiserver)
FLEET_OPERATOR_BIN=$target/release/fleet-operator "$target/release/examples/operator_bench_e2e"
