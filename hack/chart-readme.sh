#!/usr/bin/env bash
# Prints charts/fleetroll/README.md: helm-docs renders charts/fleetroll/README.md.gotmpl, whose values table
# comes from values.yaml's `# --` comments. `make generate` writes it; tests/it/chart.rs checks that the
# committed file is this output. helm-docs is built into the test environment's cache (tests/testenv/build.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck source=tests/testenv/versions.sh
. "$root/tests/testenv/versions.sh"
# shellcheck source=tests/testenv/lib.sh
. "$root/tests/testenv/lib.sh"
helm_docs=${HELM_DOCS:-$CACHE/bin/helm-docs-$HELM_DOCS_VERSION/helm-docs}
[ -x "$helm_docs" ] || die "no helm-docs at $helm_docs: run tests/testenv/build.sh (make testenv)"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
# helm-docs skips a chart it cannot parse with a warning and exits 0: any warning is a failure here.
out=$(cd "$root/charts/fleetroll" && "$helm_docs" --dry-run --log-level warning --sort-values-order file \
  --template-files README.md.gotmpl 2>"$errors")
if [ -s "$errors" ] || [ -z "$out" ]; then
  cat "$errors" >&2
  die "helm-docs did not render charts/fleetroll/README.md"
fi
printf '%s\n' "$out"
