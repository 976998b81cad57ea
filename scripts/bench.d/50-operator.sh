#!/usr/bin/env bash
# Operator placement throughput vs raw NATS KV puts on the same server in the same run, and RSS at 10,000
# devices. Prints a Markdown table (operator/examples/operator_bench.rs).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -q -p fleet-operator --example operator_bench
target=${CARGO_TARGET_DIR:-$root/target}
"$target/release/examples/operator_bench"
