#!/usr/bin/env bash
# fleet-auth: auth decisions per second (device connects through the callout: server request JWT, token verified
# with the cached JWKS, user JWT signed) and p50/p99 connect latency with 100 concurrent clients; reference: the same
# connects by a static user/password that nats-server checks itself, on the same server. Then a reconnect storm:
# 2,000 device connections through the callout, nats-server killed and started again (same port and store), the
# time until fleet-auth has admitted every device again, and fleet-auth's memory. Goals: every device back within
# 60 s (a device's own retry reaches the server again within seconds; the callout must not be the bottleneck) and
# fleet-auth's peak RSS at most 256 MiB. Then what the flood guard costs with 2,000 devices on their own connections,
# and the attacks one device's token can make against the shared server, with the bounds docs/auth.md states.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
export FLEET_NATS_SERVER=${FLEET_NATS_SERVER:-$root/.venv/bin/nats-server}
cargo build --release --locked -p fleet-auth --bin fleet-auth -p fleet-operator --example auth_bench -p fleet-vm-tests --bin fleet-sim >&2
target=${CARGO_TARGET_DIR:-$root/target}
export FLEET_AUTH_BIN=$target/release/fleet-auth FLEET_SIM_BIN=$target/release/fleet-sim
echo "| credentials | clients | connects/s | p50 connect (ms) | p99 connect (ms) | errors | result |"
echo "|---|---|---|---|---|---|---|"
"$target/release/examples/auth_bench" --clients 100 --seconds 5 | while IFS= read -r line; do
  case $line in
    "|"*) IFS='|' read -ra c <<<"$line"; echo "$line $(errors "$(trim "${c[1]}")" "$(number "${c[6]}")") |" ;;
    *) echo "$line" ;;
  esac
done
echo
echo "| reconnect storm | first connects (s) | all back after (s) | p50 back (s) | p99 back (s) | fleet-auth admissions during the storm | not back | fleet-auth RSS before / peak / after (MiB) | result |"
echo "|---|---|---|---|---|---|---|---|---|"
# 2,000 client sockets in one process, and as many in nats-server (fleet-sim: three descriptors per device).
[ "$(ulimit -n)" -ge 8192 ] || ulimit -n 8192
"$target/release/examples/auth_bench" --storm 2000 | while IFS= read -r line; do
  case $line in
    "|"*)
      IFS='|' read -ra c <<<"$line"
      rss=$(trim "${c[8]}")
      peak=$(number "${rss#*/}")
      echo "$line $(goal "reconnect storm: all back (s)" "$(number "${c[3]}")" "<=" 60 "60 s"), \
$(goal "reconnect storm: not back" "$(number "${c[7]}")" "==" 0 "0 not back"), \
$(goal "reconnect storm: fleet-auth peak RSS (MiB)" "$peak" "<=" 256 "256 MiB") |"
      ;;
    *) echo "$line" ;;
  esac
done
echo
echo "| reconnect storm, fleet-sim | first connects, every heartbeat stored (s) | nats-server listening again (s) | all admitted again (s) | all back: a heartbeat acknowledged (s) | p50 / p99 back (s) | fleet-auth admissions during the storm | connection attempts refused in the storm | not back | writes lost in the outage: unanswered / not sent | fleet-auth RSS before / peak / after (MiB) | result |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
"$target/release/examples/auth_bench" --storm-sim 2000 | while IFS= read -r line; do
  case $line in
    "|"*)
      IFS='|' read -ra c <<<"$line"
      rss=$(trim "${c[11]}")
      peak=$(number "${rss#*/}")
      echo "$line $(goal "reconnect storm (fleet-sim): all back (s)" "$(number "${c[5]}")" "<=" 60 "60 s"), \
$(goal "reconnect storm (fleet-sim): attempts refused" "$(number "${c[8]}")" "==" 0 "0 refused"), \
$(goal "reconnect storm (fleet-sim): not back" "$(number "${c[9]}")" "==" 0 "0 not back"), \
$(goal "reconnect storm (fleet-sim): fleet-auth peak RSS (MiB)" "$peak" "<=" 256 "256 MiB") |"
      ;;
    *) echo "$line" ;;
  esac
done
echo
# What the flood guard costs: 2,000 devices on their own connections (fleet-sim), fleet-auth's and nats-server's CPU
# over 30 s with the guard and again with fleet-auth started without it. Goals: the guard costs fleet-auth at most
# 10 % of a core, and nats-server (its CONNZ polls) at most 10 %.
echo "| flood guard's cost | all connected (s) | fleet-auth CPU with the guard (% of a core) | without (%) | the guard's cost in fleet-auth (%) | nats-server CPU with / without (%) | the guard's cost in nats-server (%) | fleet-auth RSS (MiB) | result |"
echo "|---|---|---|---|---|---|---|---|---|"
"$target/release/examples/auth_bench" --guard-cost 2000 | while IFS= read -r line; do
  case $line in
    "|"*)
      IFS='|' read -ra c <<<"$line"
      echo "$line $(goal "flood guard: its cost in fleet-auth (% of a core)" "$(number "${c[5]}")" "<=" 10 "10 %"), \
$(goal "flood guard: its cost in nats-server (% of a core)" "$(number "${c[7]}")" "<=" 10 "10 %") |"
      ;;
    *) echo "$line" ;;
  esac
done
echo
# The attacks of one device's token (operator/auth/tests/auth_availability.rs, release build, the guard at its defaults): what one
# device's token costs the server and the victims, each row against the bound its test asserts.
echo "| attack (one device's token) | measured | value | result |"
echo "|---|---|---|---|"
cargo test --release --locked -p fleet-auth --test auth_availability --no-run >&2
rows=$(FLEET_AUTH_BIN=$target/release/fleet-auth cargo test --release --locked -p fleet-auth \
  --test auth_availability -- --test-threads=1 --nocapture 2>/dev/null | grep -o 'bench-row|.*' || true)
n=0
while IFS='|' read -r _ attack what value op limit shown; do
  [ -n "$attack" ] || continue
  n=$((n + 1))
  echo "| $attack | $what | $value | $(goal "$attack: $what" "$value" "$op" "$limit" "$shown") |"
done <<<"$rows"
# Every test prints its rows (after the test harness's `test … ... ` on the same line); fewer means a test stopped
# before it measured (its failure is the miss).
[ "$n" -ge 16 ] || goal_missed "auth_availability printed $n of 16 rows"
