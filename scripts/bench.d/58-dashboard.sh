#!/usr/bin/env bash
# The operator's dashboard at scale: overview, device, run history and run pages with 10,000 Devices and a
# 100,000-device TaskRun plan (time and bytes per page as a client on the host sees them, operator RSS), next to
# listing the same CRs with kube's client and loading the whole plan from NATS, in the same run. Prints Markdown
# tables (operator/examples/dashboard_bench.rs). Needs scripts/setup's kube-apiserver.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -q -p fleet-operator --bin fleet-operator --example dashboard_bench
target=${CARGO_TARGET_DIR:-$root/target}
FLEET_OPERATOR_BIN=$target/release/fleet-operator "$target/release/examples/dashboard_bench"
