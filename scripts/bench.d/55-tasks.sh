#!/usr/bin/env bash
# One TaskRun's plan + release (planning with the placement rule, the chunked plan store in task-plans, the
# intent creates) over 10,000 and 100,000 devices vs raw NATS KV puts of the same intents on the same server in
# the same run, and the process's RSS. Prints a Markdown table (operator/examples/taskrun_bench.rs).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -q -p fleet-operator --example taskrun_bench
target=${CARGO_TARGET_DIR:-$root/target}
"$target/release/examples/taskrun_bench"
