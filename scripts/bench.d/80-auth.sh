#!/usr/bin/env bash
# fleet-auth: auth decisions per second (device connects through the callout: server request JWT, token verified
# with the cached JWKS, user JWT signed) and p50/p99 connect latency with 100 concurrent clients; reference: the same
# connects by a static user/password that nats-server checks itself, on the same server.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -p fleet-operator --bin fleet-auth --example auth_bench >&2
target=${CARGO_TARGET_DIR:-$root/target}
export FLEET_AUTH_BIN=$target/release/fleet-auth
echo "| credentials | clients | connects/s | p50 connect (ms) | p99 connect (ms) | errors | result |"
echo "|---|---|---|---|---|---|---|"
"$target/release/examples/auth_bench" --clients 100 --seconds 5 | while IFS= read -r line; do
  case $line in
    "|"*) IFS='|' read -ra c <<<"$line"; echo "$line $(errors "$(trim "${c[1]}")" "$(number "${c[6]}")") |" ;;
    *) echo "$line" ;;
  esac
done
