#!/usr/bin/env bash
# Rolling reboot of 3 nspawn devices in a one-slot FleetLock group: first lock → last release, with
# fleet-reboot-release.service next to today's timer-only release (vm-tests/src/bin/reboot-bench.rs). The
# reference run waits for the real timer (5–7 min per device): about 20 minutes in all.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
export FLEET_CACHE=${FLEET_CACHE:-$root/.cache}
target=${CARGO_TARGET_DIR:-$root/target}
cargo build --quiet --locked -p fleet-vm-tests --bin reboot-bench -p fleetlock-server --bin fleetlock-server
"$target/debug/reboot-bench"
