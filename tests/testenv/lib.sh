# Shared by the test-environment scripts: paths and small helpers.
# shellcheck shell=bash
CACHE=${FLEETROLL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetroll}
log() { printf '[testenv] %s\n' "$*" >&2; }
die() {
  printf '[testenv] error: %s\n' "$*" >&2
  exit 1
}

# The gitops-judge test tool (tests/testenv/gitops-judge) is cached by a hash of its sources.
GITOPS_JUDGE_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/gitops-judge" && pwd)
gitops_judge_dir() {
  local src=$GITOPS_JUDGE_SRC
  echo "$CACHE/bin/gitops-judge-$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)"
}
