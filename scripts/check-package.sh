#!/usr/bin/env bash
# Checks that the two published crates can be published: `cargo publish
# --dry-run` packages each one as crates.io would receive it and builds it
# from the package alone, so anything read at build time from outside the
# package (an `include_str!` of a file above it) fails here.
#
#  1. lock-macros alone, as a first release publishes it first: its
#     dev-dependency on lock-runtime must be a path without a version (cargo
#     then leaves it out of the published manifest; with a version, the
#     registry is asked for a lock-runtime it does not have yet).
#  2. lock-macros and lock-runtime together (cargo 1.90 or later): lock-runtime
#     is built against the lock-macros package made in the same run, as it
#     will be against the one on crates.io.
#
# Run by scripts/test.sh. --allow-dirty: the check runs on a work tree with
# changes; a real release runs from a clean one (CHANGELOG.md, "Releasing").
set -euo pipefail
cd "$(dirname "$0")/.."

cargo publish --dry-run --locked --allow-dirty -p lock-macros
cargo publish --dry-run --locked --allow-dirty -p lock-macros -p lock-runtime

# The published lock-macros manifest has no dependency on lock-runtime.
manifest=$(tar -xzOf target/package/tmp-crate/lock-macros-0.1.0.crate lock-macros-0.1.0/Cargo.toml)
if grep -q '^\[.*dependencies\.lock-runtime\]' <<<"$manifest"; then
    echo "lock-macros' published manifest depends on lock-runtime: its dev-dependency must be" \
         "a path without a version (lock-macros/Cargo.toml)" >&2
    exit 1
fi
echo "check-package: lock-macros and lock-runtime can be published (dry runs passed)"
