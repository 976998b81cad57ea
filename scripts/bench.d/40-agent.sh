#!/usr/bin/env bash
# fleet-agent: idle RSS, CPU time and wake-ups per idle minute with 10 workloads (agent and updater next to
# nats-server), desired-state put → container running with its step breakdown (10 and 50 unchanged workloads
# present) against `podman run -d` in the same run, 50 workloads at once against fifty sequential `podman run -d`,
# and the stripped release binary size. Uses real nats-server, rootful Podman and fleet-updater (test-rig.md).
# FLEET_BENCH_IDLE_SECS sets the idle window (default 60).
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --release -p fleet-agent -p fleet-updater --locked >/dev/null 2>&1 ||
  cargo build --release -p fleet-agent -p fleet-updater
getent group fleet-agent >/dev/null || bash "$root/scripts/setup.d/30-users.sh" >/dev/null
export FLEET_AGENT_BIN=$target/release/fleet-agent FLEET_UPDATER_BIN=$target/release/fleet-updater
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
RUST_LOG=${RUST_LOG:-warn} cargo run --release -q -p fleet-agent --example agent-bench
