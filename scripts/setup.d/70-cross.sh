#!/usr/bin/env bash
# aarch64 (Raspberry Pi OS) cross builds: the Rust target, the GNU cross linker and qemu-user for running the
# aarch64 unit tests (scripts/cross-build, .cargo/config.toml sets the linker and the qemu runner).
set -euo pipefail
pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "cross toolchain packages present"
fi
if rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  echo "rust target aarch64-unknown-linux-gnu present"
else
  rustup target add aarch64-unknown-linux-gnu
fi
