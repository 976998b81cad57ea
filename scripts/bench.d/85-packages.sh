#!/usr/bin/env bash
# The Debian packages (scripts/package, release binaries): installed size and .deb size of each, amd64 as the
# reference for arm64, and the stripped arm64 binaries as shipped in the package against the size goals (agent
# ≤ 5 MiB; the updater + the multicall fleet-tools, whose names include its download helper fleet-fetch, ≤ 4 MiB). Reference row: Debian's own podman package on this machine.
set -euo pipefail
root=${FLEET_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"
. "$root/scripts/bench.d/lib/goal.sh"
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/packages
scripts/package --out "$out" >"$target/package.log" 2>&1 || { tail -20 "$target/package.log" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
mib() { awk -v b="$1" 'BEGIN{printf "%.2f MiB", b/1048576}'; }
echo "| package | arch | installed | .deb |"
echo "|---|---|---|---|"
for f in "$out"/harmony-fleet-device_"$version"_amd64.deb "$out"/harmony-fleet-device_"$version"_arm64.deb \
         "$out"/fleetlock-server_"$version"_amd64.deb "$out"/fleetlock-server_"$version"_arm64.deb; do
  kib=$(dpkg-deb -f "$f" Installed-Size)
  echo "| $(dpkg-deb -f "$f" Package) | $(dpkg-deb -f "$f" Architecture) | $(mib $((kib * 1024))) | $(mib "$(stat -c %s "$f")") |"
done
podman_kib=$(dpkg-query -W -f='${Installed-Size}' podman 2>/dev/null || echo 0)
echo "| podman (Debian, reference) | $(dpkg --print-architecture) | $(mib $((podman_kib * 1024))) | |"
echo
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
dpkg-deb -x "$out/harmony-fleet-device_${version}_arm64.deb" "$dir"
b=$dir/usr/libexec/harmony-fleet/bin
sz() { stat -c %s "$b/$1"; }
echo "| arm64 binary in the package (stripped) | size | goal |"
echo "|---|---|---|"
echo "| fleet-agent | $(mib "$(sz fleet-agent)") | $(goal "arm64 fleet-agent in the package (bytes)" "$(sz fleet-agent)" "<=" 5242880 "5 MiB") |"
echo "| fleet-updater | $(mib "$(sz fleet-updater)") | |"
# fleet-fetch, fleet-reboot, fleet-token and fleet-boot-watchdog are links to fleet-tools (one HTTPS stack).
for t in fleet-fetch fleet-reboot fleet-token fleet-boot-watchdog; do
  [ "$(readlink "$b/$t")" = fleet-tools ] || { echo "85-packages: $t is not a link to fleet-tools" >&2; exit 1; }
done
echo "| fleet-tools (fleet-fetch, fleet-reboot, fleet-token, fleet-boot-watchdog) | $(mib "$(sz fleet-tools)") | |"
echo "| fleet-updater + fleet-tools | $(mib $(($(sz fleet-updater) + $(sz fleet-tools)))) | $(goal "arm64 fleet-updater + fleet-tools in the package (bytes)" $(($(sz fleet-updater) + $(sz fleet-tools))) "<=" 4194304 "4 MiB") |"
