#!/usr/bin/env bash
# The lottery demo: several instances of a noon job race for lottery:<date>;
# exactly one draws the winners. Installs redis-server when it is missing and
# starts a throwaway one unless REDIS_URL is set. Arguments go to the demo,
# e.g. `scripts/demo.sh --instances 8`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis-server.sh
cargo run --quiet --locked -p lottery -- "$@"
