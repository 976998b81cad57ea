#!/usr/bin/env bash
# fleet-agent: idle RSS with 10 workloads, desired-state put → container running against a plain `podman run` in
# the same run, and the stripped release binary size. Uses real nats-server and rootful Podman (test-rig.md).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p fleet-agent --locked >/dev/null 2>&1 || cargo build --release -p fleet-agent
export FLEET_AGENT_BIN=$target/release/fleet-agent
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
RUST_LOG=${RUST_LOG:-warn} cargo run --release -q -p fleet-agent --example agent-bench
