#!/usr/bin/env bash
# Reintroduces one hole (lock-sim/mutants/NAME.patch, applied with git apply),
# runs the simulation's seeds until the first violation, reverts the patch
# and prints how many runs it took and how long.
#
#   lock-sim/mutants/hunt.sh NAME [MAX_SEEDS]
#
# The binary it leaves in target/release is the mutant's: build again before
# other runs. The patch's header names its scenario(s) (`# scenario: quorum3`) and the
# checkers that should see the hole (`# finds: overlap`).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: hunt.sh NAME [MAX_SEEDS]}
max=${2:-500}
patch=lock-sim/mutants/$name.patch
scenario=$(sed -n 's/^# scenario: //p' "$patch" | head -1)
# The checkers that should see the hole (other kinds are not its doing).
kinds=$(sed -n 's/^# finds: //p' "$patch" | head -1)
git apply "$patch"
trap 'git apply -R "$patch"' EXIT
cargo build --release -q -p lock-sim
echo "mutant $name, scenario $scenario, checkers ${kinds:-any}:"
./target/release/lock-sim hunt --scenario "$scenario" ${kinds:+--kinds "$kinds"} --seeds "$max" || true
