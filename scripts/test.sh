#!/usr/bin/env bash
# Runs every test of the workspace. Installs redis-server first when it is
# missing; each test starts its own redis-server on a free loopback port.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis-server.sh
cargo test --workspace --locked
