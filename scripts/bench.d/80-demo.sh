#!/usr/bin/env bash
# The operator's overhead on a real fleet: a whole-fleet agent upgrade of three nspawn devices, through an
# AgentRelease applied with kubectl (the real fleet-operator, kube-apiserver, NATS) next to the same kind of upgrade
# written straight into NATS KV, in the same run (vm-tests/src/bin/upgrade-bench.rs). Needs root and scripts/setup.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_CACHE=${FLEET_CACHE:-$root/.cache}
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
target=${CARGO_TARGET_DIR:-$root/target}
# Debug builds, like the devices' agents in every whole-device test (the operator's own speed is 50-operator).
cargo build --quiet --locked -p fleet-vm-tests --bin upgrade-bench -p fleet-operator --bin fleet-operator
"$target/debug/upgrade-bench"
