#!/usr/bin/env bash
# Run the 2026-07-28 stateless + Tasks-extension conformance scenarios against a server.
# usage: conformance.sh URL [OUTDIR] [EXPECTED_FAILURES_YAML]
# Needs install.sh to have run (uses ~/.cache/fleetroll/bin/conformance, Node 22).
# Note: tasks-* are "extension" scenarios: passing --spec-version makes them SKIP (exit 0),
# so they are run without it (they default to 2026-07-28).
set -uo pipefail
URL="${1:?usage: conformance.sh URL [OUTDIR] [EXPECTED_FAILURES_YAML]}"
OUT="${2:-./conformance-results}"
BASELINE="${3:-}"
CONF="${CONFORMANCE:-${FLEETROLL_CACHE:-$HOME/.cache/fleetroll}/bin/conformance}"
TASKS=(tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
       tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications
       tasks-required-task-error tasks-mrtr-composition)
mkdir -p "$OUT"
rc=0
run() {  # scenario [extra flags...]
  local s="$1"; shift
  local args=(server --url "$URL" --scenario "$s" -o "$OUT" "$@")
  [[ -n "$BASELINE" ]] && args+=(--expected-failures "$BASELINE")
  "$CONF" "${args[@]}" > "$OUT/$s.log" 2>&1
  local r=$?
  printf '%-32s exit=%d  %s\n' "$s" "$r" "$(sed 's/\x1b\[[0-9;]*m//g' "$OUT/$s.log" | grep -m1 '^Passed:')"
  [[ $r -eq 0 ]] || rc=1
}
run server-stateless --spec-version 2026-07-28
for s in "${TASKS[@]}"; do run "$s"; done
exit $rc
