#!/usr/bin/env bash
# One pass of the rollout planner over 100,000 devices at the start, middle and end of a staged rollout, next to
# the same devices without a rollout section; then a whole operator pass for a FleetDeployment change on 100,000
# devices, staged and not (its own path: desired-state keys and workload reports). Prints two Markdown tables
# (operator/examples/rollout_bench.rs).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
cargo build --release --locked -q -p fleet-operator --example rollout_bench
target=${CARGO_TARGET_DIR:-$root/target}
"$target/release/examples/rollout_bench"
