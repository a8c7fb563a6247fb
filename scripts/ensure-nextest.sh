#!/usr/bin/env bash
# Makes sure cargo-nextest (the test runner scripts/test.sh uses: every
# test in its own process, several at once) is installed, building it from
# crates.io when it is missing (a few minutes, once).
set -euo pipefail
if cargo nextest --version >/dev/null 2>&1; then
  exit 0
fi
echo "cargo-nextest not found: installing it from crates.io (cargo install cargo-nextest --locked)" >&2
cargo install cargo-nextest --locked
