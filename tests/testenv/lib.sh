# Shared by the test-environment scripts: paths and small helpers.
# shellcheck shell=bash
CACHE=${FLEETROLL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetroll}
log() { printf '[testenv] %s\n' "$*" >&2; }
die() {
  printf '[testenv] error: %s\n' "$*" >&2
  exit 1
}
