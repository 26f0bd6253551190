#!/usr/bin/env bash
# Runs a command against a cluster, exporting KUBECONFIG for it:
#   - FLEETROLL_TEST_KUBECONFIG, when set (a user's own cluster; nothing is built or started);
#   - else the local control plane if one is up (left running afterwards), with MEMBERS member clusters
#     (default 2) added if they are not up yet;
#   - else a local control plane with MEMBERS members started for this command and stopped when it ends,
#     pass or fail.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/testenv/lib.sh
. "$here/lib.sh"
root=$(cd "$here/../.." && pwd)
export FLEETROLL_MEMBERS=${MEMBERS:-${FLEETROLL_MEMBERS:-2}}

if [ -n "${FLEETROLL_TEST_KUBECONFIG:-}" ]; then
  log "using the cluster of FLEETROLL_TEST_KUBECONFIG=$FLEETROLL_TEST_KUBECONFIG"
  export KUBECONFIG=$FLEETROLL_TEST_KUBECONFIG
elif "$here/cluster.sh" status; then
  log "using the local control plane that is already up"
  "$here/cluster.sh" tools
  export KUBECONFIG=${FLEETROLL_TESTENV:-$root/target/testenv}/kubeconfig
elif FLEETROLL_MEMBERS=0 "$here/cluster.sh" status; then
  log "using the local control plane that is already up, bringing up its $FLEETROLL_MEMBERS members"
  "$here/cluster.sh" up "${NODES:-10}" >/dev/null
  export KUBECONFIG=${FLEETROLL_TESTENV:-$root/target/testenv}/kubeconfig
else
  trap '"$here/cluster.sh" down' EXIT
  "$here/cluster.sh" up "${NODES:-10}" >/dev/null
  export KUBECONFIG=${FLEETROLL_TESTENV:-$root/target/testenv}/kubeconfig
fi
"$@"
