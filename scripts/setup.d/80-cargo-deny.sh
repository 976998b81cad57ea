#!/usr/bin/env bash
# cargo-deny, for the dependency checks in scripts/test (deny.toml: bans, licenses, sources). Built from crates.io
# with its own lock file (about 5-10 minutes once on 2 cores; the binary stays in ~/.cargo/bin).
set -euo pipefail
version=0.20
if command -v cargo-deny >/dev/null && cargo-deny --version | grep -q "^cargo-deny $version\."; then
  echo "$(cargo-deny --version) present"
  exit 0
fi
cargo install cargo-deny --locked --version "~$version" -j 2
