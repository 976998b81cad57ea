#!/usr/bin/env bash
# Installs a foreign-architecture harmony-fleet-device package's files into a temporary root (dpkg-deb -x) and
# starts its binaries under qemu-user: each answers --version with the package's version and --help; the updater
# starts on a temporary root, opens its socket and answers a status request.
# Usage: scripts/debian/smoke-foreign.sh harmony-fleet-device_<version>_arm64.deb
set -euo pipefail
deb=${1:?usage: smoke-foreign.sh PACKAGE.deb}
arch=$(dpkg-deb -f "$deb" Architecture)
version=$(dpkg-deb -f "$deb" Version)
case "$arch" in
  arm64) run=(qemu-aarch64-static -L /usr/aarch64-linux-gnu) ;;
  *) echo "smoke-foreign: no emulator for $arch" >&2; exit 2 ;;
esac
command -v "${run[0]}" >/dev/null || { echo "smoke-foreign: ${run[0]} missing: scripts/setup cross" >&2; exit 1; }
dir=$(mktemp -d)
pid=''
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
dpkg-deb -x "$deb" "$dir/pkg"
bin=$dir/pkg/usr/libexec/harmony-fleet/bin
# fleet-fetch, fleet-reboot, fleet-boot-watchdog and fleet-token are links to the multicall fleet-tools.
for b in fleet-agent fleet-updater fleet-tools fleet-fetch fleet-reboot fleet-boot-watchdog fleet-token; do
  got=$("${run[@]}" "$bin/$b" --version)
  [ "$got" = "$version" ] || { echo "smoke-foreign: $b --version says '$got', the package is $version" >&2; exit 1; }
  # Each names itself first: a link that ran fleet-tools' own help instead would say "fleet-tools:".
  help=$("${run[@]}" "$bin/$b" --help)
  [ "${help%%:*}" = "$b" ] || { echo "smoke-foreign: $b --help does not describe $b: ${help%%$'\n'*}" >&2; exit 1; }
  printf '%-14s %s --version: %s, --help: ok\n' "$b" "$arch" "$got"
done
# The updater on a temporary root, as root's own group (no fleet-agent user on a build machine).
mkdir -p "$dir/root"
printf 'root = "%s/root"\nsocket_group = "root"\nagent_user = "root"\n' "$dir" >"$dir/updater.toml"
"${run[@]}" "$bin/fleet-updater" --config "$dir/updater.toml" 2>"$dir/updater.log" &
pid=$!
sock=$dir/root/run/fleet-updater/updater.sock
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$dir/updater.log" >&2; echo "smoke-foreign: no updater socket after 10 s" >&2; exit 1; }
answer=$(python3 - "$sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(b'{"protocol":1,"request":{"op":"status"}}\n')
print(s.makefile().readline(1 << 20).strip())
PY
)
case "$answer" in
  *'"kind":"status"'*) echo "fleet-updater  $arch started, status: $answer" ;;
  *) echo "smoke-foreign: unexpected updater answer: $answer" >&2; cat "$dir/updater.log" >&2; exit 1 ;;
esac
