#!/usr/bin/env bash
# `make demo`: the whole product, from nothing, on a local control plane.
#
#   hack/demo.sh             build, start the cluster, create a fleet, run the operator, roll over MCP, watch
#   hack/demo.sh operator    (re)start the operator in the background (after killing it, say)
#   hack/demo.sh down        stop the operator and the cluster
#
# FLEETROLL_DEMO_DIR (target/demo), FLEETROLL_DEMO_PORT (18080),
# FLEETROLL_DEMO_KUBECONFIG (a cluster of your own, with the chart installed, instead of the local control
# plane), FLEETROLL_DEMO_BIN (a fleetroll binary to run instead of building one) and FLEETROLL_TESTENV (where
# the local control plane lives: target/testenv) adjust it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
D=${FLEETROLL_DEMO_DIR:-$root/target/demo}
PORT=${FLEETROLL_DEMO_PORT:-18080}
FLEET_NS=fleetroll-system
TENANTS=(tenant-1 tenant-2 tenant-3 tenant-4)
TENANT_LABEL=tenant
TESTENV=${FLEETROLL_TESTENV:-$root/target/testenv}
BIN=$TESTENV/bin
# The fleetroll binary: built below, unless the caller brings its own (the demo test runs the one cargo built
# for the tests, which a build here would replace with one of other features).
FLEETROLL=${FLEETROLL_DEMO_BIN:-$root/target/debug/fleetroll}
mkdir -p "$D/bin"

bold() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
export KUBECONFIG=${FLEETROLL_DEMO_KUBECONFIG:-$TESTENV/kubeconfig}
export PATH=$D/bin:$BIN:$PATH

start_operator() {
  stop_operator
  setsid "$FLEETROLL" operator --listen "127.0.0.1:$PORT" --fleet-namespace "$FLEET_NS" \
    --lease-namespace "$FLEET_NS" --identity "demo-operator" --auth none \
    >"$D/operator.log" 2>&1 </dev/null &
  echo $! >"$D/operator.pid"
  local deadline=$((SECONDS + 60))
  until curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { tail -20 "$D/operator.log"; echo "the operator did not become ready" >&2; exit 1; }
    kill -0 "$(cat "$D/operator.pid")" 2>/dev/null || { tail -20 "$D/operator.log"; exit 1; }
    sleep 0.2
  done
  echo "operator running (pid $(cat "$D/operator.pid")), MCP at http://127.0.0.1:$PORT/mcp, logs in $D/operator.log"
}

stop_operator() {
  if [ -f "$D/operator.pid" ]; then
    local pid
    pid=$(cat "$D/operator.pid")
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$D/operator.pid"
  fi
}

case "${1:-}" in
  operator) start_operator; exit 0 ;;
  stop-operator) stop_operator; exit 0 ;;
  down) stop_operator; tests/testenv/cluster.sh down; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [operator|stop-operator|down]" >&2; exit 2 ;;
esac

if [ -z "${FLEETROLL_DEMO_BIN:-}" ]; then
  bold "Building fleetroll"
  cargo build --locked --quiet
fi
ln -sf "$FLEETROLL" "$D/bin/kubectl-fleetroll"

if [ -z "${FLEETROLL_DEMO_KUBECONFIG:-}" ]; then
  bold "Starting a local Kubernetes control plane (the first run builds it from source: about 15 minutes)"
  echo "  with fleetroll's chart installed, as on a real cluster: the CRDs, the admission policies that record"
  echo "  who created each rollout (the operator acts as that person), the roles; the operator runs here"
  tests/testenv/cluster.sh up 10 >/dev/null
else
  bold "Using the cluster of $FLEETROLL_DEMO_KUBECONFIG"
fi
kubectl get nodes --no-headers | awk '{print "  " $1, $2}' | head -3 && echo "  ..."

kubectl get crd fleetrollouts.fleetroll.dev >/dev/null 2>&1 ||
  { echo "no FleetRollout CRD on this cluster: install the chart first (docs/src/helm.md)" >&2; exit 1; }
kubectl wait --for=condition=Established crd/fleetrollouts.fleetroll.dev --timeout=60s >/dev/null
echo "  kubectl get fleetrollouts works (short name: fro)"

bold "Creating 40 tenant Deployments in 4 namespaces opted in to fleet rollouts"
{
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata: {name: $FLEET_NS}"
  for t in "${TENANTS[@]}"; do
    cat <<EOF
---
apiVersion: v1
kind: Namespace
metadata:
  name: $t
  labels: {fleetroll.dev/rollouts: enabled, fleetroll.dev/demo: $TENANT_LABEL}
EOF
    for i in $(seq -w 1 10); do
      cat <<EOF
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web-$i, namespace: $t, labels: {app.kubernetes.io/part-of: storefront}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web-$i}}
  template:
    metadata: {labels: {app: web-$i}}
    spec: {containers: [{name: web, image: registry.k8s.io/pause:3.10}]}
EOF
    done
  done
} | kubectl apply --server-side --force-conflicts -f - >/dev/null  # a re-run resets the fleet to v1
for t in "${TENANTS[@]}"; do kubectl -n "$t" wait --for=condition=Available deployment --all --timeout=120s >/dev/null; done
kubectl get deployments -A -l app.kubernetes.io/part-of=storefront --no-headers | awk '{print "  " $1 "/" $2, $3}' | head -3
echo "  ... 40 Deployments, all on registry.k8s.io/pause:3.10"

bold "Starting the operator, with its MCP server"
start_operator

bold "Installing a real MCP client (the Python mcp SDK)"
eval "$(tests/mcp/install.sh 2>/dev/null | grep '^PYTHON=')"

bold "An agent starts the rollout over MCP (tools/call rollout_fleet, with the Tasks extension)"
IMAGE=registry.k8s.io/pause:3.9
kubectl -n "$FLEET_NS" delete fro tenants --ignore-not-found >/dev/null
ARGS=$(cat <<EOF
{"namespace": "$FLEET_NS", "name": "tenants", "image": "$IMAGE",
 "targets": {"kind": "Deployment", "selector": {"matchLabels": {"app.kubernetes.io/part-of": "storefront"}},
             "namespaceSelector": {"matchLabels": {"fleetroll.dev/demo": "$TENANT_LABEL"}}},
 "strategy": {"batchSize": 10, "pauseBetweenBatches": "2s"}, "health": {"soak": "2s"}}
EOF
)
URL=http://127.0.0.1:$PORT/mcp
CREATED=$(cd tests/mcp && "$PYTHON" drive.py start "$URL" "$ARGS")
TASK=$(printf '%s' "$CREATED" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["taskId"])')
echo "  task: $TASK"
echo "  (any replica, after any restart, answers tasks/get for it: the task is the FleetRollout)"

bold "Watching it: kubectl fleetroll status tenants -n $FLEET_NS"
kubectl fleetroll status tenants -n "$FLEET_NS" --timeout 10m

bold "The agent polls the task: tasks/get"
(cd tests/mcp && "$PYTHON" drive.py get "$URL" "$TASK") | "$PYTHON" -c '
import json, sys
t = json.load(sys.stdin)
print("  status:", t["status"], "| isError:", t["result"]["isError"])
print("  " + t["result"]["content"][0]["text"])'
kubectl get fro -A

cat <<EOF

Done. fleetroll is running on a local cluster. Try:

  export KUBECONFIG=$KUBECONFIG PATH=$D/bin:$BIN:\$PATH${FLEETROLL_TESTENV:+ FLEETROLL_TESTENV=$FLEETROLL_TESTENV}${FLEETROLL_DEMO_DIR:+ FLEETROLL_DEMO_DIR=$FLEETROLL_DEMO_DIR}

  # Every rollout, its batch and progress; the frozen plan; conditions and one event per transition:
  kubectl get fro -A -o wide
  kubectl fleetroll plan tenants -n $FLEET_NS
  kubectl describe fro tenants -n $FLEET_NS

  # Roll again, kill the operator mid-way (nothing moves while it is gone), start it again, and watch it
  # resume at the right batch without changing any Deployment twice:
  kubectl -n $FLEET_NS patch fro tenants --type=merge -p '{"spec":{"image":"registry.k8s.io/pause:3.8"}}'
  kill -9 \$(cat $D/operator.pid)
  make demo-operator
  kubectl fleetroll status tenants -n $FLEET_NS

  # Stop the operator and the cluster:
  make demo-down
EOF
