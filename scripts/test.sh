#!/usr/bin/env bash
# Runs every test of the workspace, then cargo fmt --check, clippy,
# cargo doc with warnings denied and the publishing dry runs
# (scripts/check-package.sh). Installs redis-server and cargo-nextest
# first when they are missing; each test starts its own redis-server on a
# free loopback port.
#
# The tests run under cargo-nextest (.config/nextest.toml: each test in its
# own process, four at once), then the documentation's examples (doctests)
# under cargo test. Every test runs even when one fails; the run ends with
# one line adding up the results and the name of each failing test, so one
# failure hides nothing.
#
# The workspace run builds lock-runtime with the features its packages ask
# for together (Cargo unifies them: the tests turn on tls-rustls and
# metrics), so lock-runtime's unit tests and lints also run on their own,
# without features: a build without TLS must say how to get it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-redis-server.sh
scripts/ensure-nextest.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
started=$(date +%s)
cargo nextest run --workspace --locked 2>&1 | tee "$log" || status=1
cargo nextest run -p lock-runtime --lib --locked 2>&1 | tee -a "$log" || status=1
cargo test --workspace --doc --locked 2>&1 | tee -a "$log" || status=1
scripts/test-summary.awk "$log" || status=1
echo "tests took $(( $(date +%s) - started )) s"
# The code's own checks: formatting, lints, documentation (warnings are errors).
# rustfmt and clippy come with rustup's default profile; add them if missing.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi
cargo fmt --all --check || { echo "cargo fmt --check failed: run cargo fmt" >&2; status=1; }
cargo clippy --workspace --all-targets --locked -- -D warnings || status=1
cargo clippy -p lock-runtime --all-targets --locked -- -D warnings || status=1
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked || status=1
# lock-macros and lock-runtime can be published: packaged and built from the
# package alone, in a first release's order (about 20 s once built).
scripts/check-package.sh || status=1
if [ "$status" -ne 0 ]; then
    echo "FAILED: see the failing tests listed above (after 'tests:') and the checks' messages" >&2
fi
exit "$status"
