#!/usr/bin/env bash
# Makes sure redis-server and redis-cli (which the cluster tests use to
# create and reshard their clusters) are available, installing Debian's
# packages when they are missing. Debian's are built with TLS, which
# tests/tls.rs needs (a redis-server of your own must be built with
# BUILD_TLS=yes); the TLS tests make their certificates in Rust (rcgen),
# with no openssl command or library needed to build them. It starts nothing: the tests and the demo start their
# own private servers on free loopback ports and stop them afterwards.
set -euo pipefail

if { [ -n "${REDIS_SERVER:-}" ] || command -v redis-server >/dev/null 2>&1; } &&
   { [ -n "${REDIS_CLI:-}" ] || command -v redis-cli >/dev/null 2>&1; }; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "redis-server or redis-cli is missing and this is not a Debian-like system: install Redis" \
       "(version 6.2 or later) and put redis-server on PATH, or set REDIS_SERVER." >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "redis-server is missing; install it as root with:" >&2
    echo "  apt-get update && apt-get install -y redis-server redis-tools" >&2
    exit 1
  fi
  sudo="sudo"
fi
echo "redis-server or redis-cli not found: installing Debian's redis-server and redis-tools packages" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
command -v redis-server >/dev/null
command -v redis-cli >/dev/null
