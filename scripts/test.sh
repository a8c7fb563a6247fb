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
valkey=$(scripts/ensure-valkey-server.sh)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
started=$(date +%s)
cargo nextest run --workspace --locked 2>&1 | tee "$log" || status=1
cargo nextest run -p lock-runtime --lib --locked 2>&1 | tee -a "$log" || status=1
cargo test --workspace --doc --locked 2>&1 | tee -a "$log" || status=1
# The Valkey matrix: server-facing tests that cover every backend, run again
# with valkey-server (Valkey 9) in place of redis-server (test-support starts
# the binary REDIS_SERVER names): one node (mutual exclusion across
# processes, the manual calls, a tonic-style service), sets on a node, a
# cluster and a quorum, a cluster across processes, a quorum losing a
# minority then a majority, a Sentinel failover with a SIGKILLed primary,
# and a master name no sentinel monitors. About 30 s. Failures are listed as `[valkey] lock-tests::...`.
valkey_matrix='binary(mutual_exclusion) | binary(manual_calls) | binary(async_trait)
    | binary(multi_lock_backends)
    | test(=no_update_is_lost_across_processes_on_a_cluster)
    | test(=processes_exclude_each_other_and_tokens_increase_while_nodes_stop)
    | test(=a_holder_rides_out_a_killed_minority_and_is_stopped_by_a_killed_majority)
    | test(=a_killed_primary_keeps_exclusion_across_processes_and_reports_the_lost_locks)
    | test(=a_misspelt_sentinel_master_name_says_so)'
echo "Valkey matrix: $("$valkey" --version)"
REDIS_SERVER="$valkey" cargo nextest run -p lock-tests --locked -E "$valkey_matrix" 2>&1 |
    sed -u 's/\(\(FAIL\|TIMEOUT\|SIGSEGV\|SIGABRT\|ABORT\) \[[^]]*\] \(([0-9/]*) \)\{0,1\}\)lock-tests::/\1[valkey] lock-tests::/' |
    tee -a "$log" || status=1
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
# package alone, in a first release's order (about 7 s once built, 40 s the
# first time: the package is built in target/package).
scripts/check-package.sh || status=1
if [ "$status" -ne 0 ]; then
    echo "FAILED: see the failing tests listed above (after 'tests:') and the checks' messages" >&2
fi
exit "$status"
