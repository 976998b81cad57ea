#!/usr/bin/env bash
# One pass of the rollout planner over 100,000 devices at the start, middle and end of a staged rollout, next to
# the same devices without a rollout section; then a whole operator pass for a FleetDeployment change on 100,000
# devices, staged and not (its own path: desired-state keys and workload reports). Prints two Markdown tables
# (operator/examples/rollout_bench.rs). Then the cost of staging on a real fleet: three nspawn devices upgraded
# through the real operator with and without `rollout: {soakSeconds: 0}` in the same run
# (vm-tests/src/bin/upgrade-bench.rs --staging; needs root and scripts/setup).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
cargo build --release --locked -q -p fleet-operator --example rollout_bench
target=${CARGO_TARGET_DIR:-$root/target}
"$target/release/examples/rollout_bench"
echo
export FLEET_CACHE=${FLEET_CACHE:-$root/.cache}
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
# Debug builds, like the devices' agents in every whole-device test (the operator's own speed is 50-operator).
cargo build --quiet --locked -p fleet-vm-tests --bin upgrade-bench -p fleet-operator --bin fleet-operator
"$target/debug/upgrade-bench" --staging
