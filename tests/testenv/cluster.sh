#!/usr/bin/env bash
# A real local control plane as plain processes on 127.0.0.1: etcd, kube-apiserver (TLS, RBAC,
# ServiceAccount token signing), kube-controller-manager, kube-scheduler and kwok with fake nodes; and, with
# FLEETROLL_MEMBERS=N, N member clusters beside it (tests/testenv/members.sh).
#
#   cluster.sh up [NODES]   start one (or reuse the one that is up, adding nodes up to NODES, and members up
#                           to FLEETROLL_MEMBERS); with FLEETROLL_PROMETHEUS=1 also a Prometheus on
#                           127.0.0.1:9090 (FLEETROLL_PROMETHEUS_PORT)
#   cluster.sh down         stop every process `up` started (members too), by PID, and remove the state
#   cluster.sh status       exit 0 when the hub and the FLEETROLL_MEMBERS first members (default: those
#                           `up` started) are up and answering
#   cluster.sh tools        build what is missing from the cache and link it into bin/ (no cluster needed)
#   cluster.sh restart [member-N/]COMPONENT    stop one component by PID and start it again
#   cluster.sh member-secrets NAMESPACE        write the members' Secrets (Argo CD and Cluster API style)
#                                              into NAMESPACE of the hub
#
# State lives in $FLEETROLL_TESTENV (default target/testenv): kubeconfig, bin/ (links to the cached
# binaries), pki/, pids/, logs/, ports/, etcd/, prometheus/, and members/member-N/ with the same layout for
# each member. Ports are chosen free at start, so nothing else is disturbed (but the optional Prometheus',
# which is fixed so that it is easy to name).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=tests/testenv/versions.sh
. "$here/versions.sh"
# shellcheck source=tests/testenv/lib.sh
. "$here/lib.sh"

W=${FLEETROLL_TESTENV:-$root/target/testenv}
BIN=$W/bin

# The control plane the functions below act on, set by `plane`: its name (hub or member-N), state
# directory, loopback address, admin kubeconfig and components in start order (reverse is the stop order).
PLANE='' D='' IP='' KCFG=''
COMPONENTS=()
plane() {
  PLANE=$1
  case "$1" in
    hub) D=$W IP=127.0.0.1 ;;
    member-[1-9] | member-[1-9][0-9] | member-1[0-9][0-9]) D=$W/members/$1 IP=127.0.0.$((1 + ${1#member-})) ;;
    *) die "no such control plane: $1 (hub or member-1..199)" ;;
  esac
  KCFG=$D/kubeconfig
  # Members get an etcd each rather than a prefix of the hub's: measured with 2 members, sharing saved 88 MiB
  # of 1.7 GiB and no start time (5-6 s both), and an own etcd keeps a hub etcd fault a hub fault.
  COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
  # The hub also trusts an OpenID Connect issuer of its own, so that tests have people with bearer tokens.
  [ "$1" != hub ] || COMPONENTS=(etcd oidc-issuer kube-apiserver kube-controller-manager kube-scheduler kwok)
}
plane hub

kubectl() { "$BIN/kubectl" --kubeconfig="$KCFG" "$@"; }

# Polls a command until it succeeds or the deadline passes; prints the component's log tail on failure.
wait_for() {
  local what=$1 seconds=$2 logname=$3
  shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      [ -f "$D/logs/$logname.log" ] && tail -n 30 "$D/logs/$logname.log" >&2
      die "$PLANE: timed out after ${seconds}s waiting for $what"
    fi
    if [ -n "$logname" ] && [ -f "$D/pids/$logname.pid" ] && ! kill -0 "$(cat "$D/pids/$logname.pid")" 2>/dev/null; then
      tail -n 30 "$D/logs/$logname.log" >&2
      die "$PLANE: $logname exited while waiting for $what"
    fi
    sleep 0.2
  done
}

# The host's first IPv4 address that is not loopback (empty if it has none).
host_ip() { hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep -v ':' | head -n1 || true; }

# A port free now, chosen below the kernel's ephemeral range: a port from bind(0) is in that range, and before
# the server binds it, any connection's source port or another bind(0) may take it ("address already in use").
free_port() {
  python3 - "$IP" <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    s = socket.socket()
    try:
        s.bind((sys.argv[1], random.randint(10000, low - 1) if low > 11000 else 0))
    except OSError:
        continue
    print(s.getsockname()[1])
    break
else:
    sys.exit("no free port below the ephemeral range")
PY
}

# Starts a component in its own session so `down` can stop it and all its children by process group.
spawn() {
  local name=$1
  shift
  setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$D/pids/$name.pid"
}

link_binaries() {
  mkdir -p "$BIN"
  local k="$CACHE/bin/kubernetes-$K8S_VERSION"
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf "$k/$b" "$BIN/$b"; done
  ln -sf "$CACHE/bin/etcd-$ETCD_VERSION/etcd" "$BIN/etcd"
  ln -sf "$CACHE/bin/kwok-$KWOK_VERSION/kwok" "$BIN/kwok"
  ln -sf "$CACHE/bin/helm-$HELM_VERSION/helm" "$BIN/helm"
  ln -sf "$(gitops_judge_dir)/gitops-judge" "$BIN/gitops-judge"
  ln -sf "$CACHE/bin/validate-krew-manifest-$KREW_VERSION/validate-krew-manifest" "$BIN/validate-krew-manifest"
  ln -sf "$CACHE/bin/helm-docs-$HELM_DOCS_VERSION/helm-docs" "$BIN/helm-docs"
  ln -sf "$CACHE/bin/prometheus-$PROMETHEUS_VERSION/prometheus" "$BIN/prometheus"
  ln -sf "$CACHE/bin/alertmanager-$ALERTMANAGER_VERSION/alertmanager" "$BIN/alertmanager"
}

# cert NAME SUBJECT EKU [SAN]: a key and a certificate signed by the current plane's CA, in its pki/.
cert() {
  local p=$D/pki ext="$D/pki/$1.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    [ -z "${4:-}" ] || echo "subjectAltName=$4"
  } >"$ext"
  openssl req -newkey rsa:2048 -nodes -keyout "$p/$1.key" -out "$p/$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$p/$1.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 3650 \
    -extfile "$ext" -out "$p/$1.crt" 2>/dev/null
  rm -f "$p/$1.csr" "$ext"
}

# One CA per plane (so no credential of one works on another); a serving cert for the apiserver on the
# plane's address; client certs whose CN/O the bootstrap RBAC policy knows; the ServiceAccount signing key.
make_pki() {
  local p=$D/pki
  mkdir -p "$p"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$p/ca.key" -out "$p/ca.crt" -days 3650 \
    -subj "/CN=fleetroll-testenv-$PLANE-ca" 2>/dev/null
  cert apiserver /CN=kube-apiserver serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:$IP,IP:10.96.0.1"
  # The admin is a cluster-admin by a ClusterRoleBinding, not a member of system:masters (as kubeadm's
  # admin.conf since 1.29): an identity that can be impersonated, so the operator can act as rollouts
  # created with it. super-admin (system:masters) only creates that binding.
  cert admin "/O=fleetroll:cluster-admins/CN=fleetroll-admin" clientAuth
  cert super-admin "/O=system:masters/CN=fleetroll-super-admin" clientAuth
  cert kcm /CN=system:kube-controller-manager clientAuth
  cert scheduler /CN=system:kube-scheduler clientAuth
  cert kwok "/O=system:masters/CN=kwok" clientAuth
  # The API server's client certificate for kubelets (logs, exec): a real node's kubelet authorizes it.
  cert kubelet-client /CN=kube-apiserver-kubelet-client clientAuth
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$p/sa.key" 2>/dev/null
  openssl pkey -in "$p/sa.key" -pubout -out "$p/sa.pub"
  if [ "$PLANE" = hub ]; then
    cert oidc-issuer /CN=fleetroll-testenv-oidc serverAuth "IP:$IP"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$p/oidc-signing.key" 2>/dev/null
  fi
}

# The hub's OpenID Connect issuer (tests/testenv/oidc-issuer.py) and the API server's configuration to trust
# its tokens: audience fleetroll-testenv, username from `sub` and groups from `groups`, both prefixed oidc:.
start_oidc_issuer() {
  local modulus
  modulus=$(openssl rsa -in "$D/pki/oidc-signing.key" -noout -modulus 2>/dev/null | cut -d= -f2)
  spawn oidc-issuer python3 "$here/oidc-issuer.py" "$IP" "$(port oidc-issuer)" \
    "$D/pki/oidc-issuer.crt" "$D/pki/oidc-issuer.key" "$modulus"
  echo "https://$IP:$(port oidc-issuer)" >"$D/oidc-issuer-url"
  {
    echo "apiVersion: apiserver.config.k8s.io/v1"
    echo "kind: AuthenticationConfiguration"
    echo "jwt:"
    echo "  - issuer:"
    echo "      url: https://$IP:$(port oidc-issuer)"
    echo "      audiences: [fleetroll-testenv]"
    echo "      certificateAuthority: |"
    sed 's/^/        /' "$D/pki/ca.crt"
    echo "    claimMappings:"
    echo "      username: {claim: sub, prefix: \"oidc:\"}"
    echo "      groups: {claim: groups, prefix: \"oidc:\"}"
  } >"$D/authentication-config.yaml"
  wait_for "the OIDC issuer" 30 oidc-issuer \
    curl -fsS --cacert "$D/pki/ca.crt" "https://$IP:$(port oidc-issuer)/.well-known/openid-configuration"
}

# Names the cluster and context of a plane's kubeconfigs: the hub keeps its historical name.
context_name() { if [ "$PLANE" = hub ]; then echo fleetroll-testenv; else echo "fleetroll-$PLANE"; fi; }

# write_kubeconfig FILE USER: certificates are embedded, so the file works from any directory.
write_kubeconfig() {
  local f=$1 user=$2 k="$BIN/kubectl" c
  c=$(context_name)
  rm -f "$f"
  "$k" config --kubeconfig="$f" set-cluster "$c" --server="https://$IP:$(port apiserver)" \
    --certificate-authority="$D/pki/ca.crt" --embed-certs >/dev/null
  "$k" config --kubeconfig="$f" set-credentials "$user" --client-certificate="$D/pki/$user.crt" \
    --client-key="$D/pki/$user.key" --embed-certs >/dev/null
  "$k" config --kubeconfig="$f" set-context "$c" --cluster="$c" --user="$user" >/dev/null
  "$k" config --kubeconfig="$f" use-context "$c" >/dev/null
}

port() { cat "$D/ports/$1"; }

start_etcd() {
  local client peer
  client=http://$IP:$(port etcd) peer=http://$IP:$(port etcd-peer)
  spawn etcd "$BIN/etcd" --name=node0 --data-dir="$D/etcd" \
    --listen-client-urls="$client" --advertise-client-urls="$client" \
    --listen-peer-urls="$peer" --initial-advertise-peer-urls="$peer" --initial-cluster="node0=$peer" \
    --unsafe-no-fsync=true --auto-compaction-retention=1 --quota-backend-bytes=8589934592 --log-level=warn
  wait_for "etcd health" 30 etcd curl -fsS "$client/health"
}

start_apiserver() {
  local adv=() authn=()
  [ "$PLANE" != hub ] || authn=(--authentication-config="$D/authentication-config.yaml")
  # With a loopback bind address the apiserver advertises the default-route IP, and refuses to start
  # on a host that has none.
  if ! awk 'NR > 1 && $2 == "00000000" { found = 1 } END { exit !found }' /proc/net/route; then
    local ip
    ip=$(host_ip)
    [ -n "$ip" ] || die "this host has no default route and no non-loopback IPv4 address for --advertise-address"
    adv=(--advertise-address="$ip")
  fi
  spawn kube-apiserver "$BIN/kube-apiserver" "${adv[@]}" "${authn[@]}" \
    --etcd-servers="http://$IP:$(port etcd)" \
    --bind-address="$IP" --secure-port="$(port apiserver)" \
    --tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
    --client-ca-file="$D/pki/ca.crt" \
    --kubelet-client-certificate="$D/pki/kubelet-client.crt" --kubelet-client-key="$D/pki/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$D/pki/sa.pub" --service-account-signing-key-file="$D/pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --authorization-mode=Node,RBAC --allow-privileged=true \
    --audit-policy-file="$here/audit-policy.yaml" --audit-log-path="$D/logs/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=1 --audit-log-format=json \
    --max-requests-inflight=2000 --max-mutating-requests-inflight=1000 \
    --profiling=false --v=1
  wait_for "kube-apiserver /readyz" 120 kube-apiserver \
    curl -fsS --cacert "$D/pki/ca.crt" "https://$IP:$(port apiserver)/readyz"
}

start_controller_manager() {
  write_kubeconfig "$D/kcm.kubeconfig" kcm
  # Each controller gets its own ServiceAccount credentials, as kubeadm does; QPS is raised so that
  # thousands of Deployments (the scale benchmarks) are not throttled by the client side.
  spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$D/kcm.kubeconfig" \
    --authentication-kubeconfig="$D/kcm.kubeconfig" --authorization-kubeconfig="$D/kcm.kubeconfig" \
    --bind-address="$IP" --secure-port="$(port controller-manager)" --leader-elect=false \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$D/pki/sa.key" --root-ca-file="$D/pki/ca.crt" \
    --cluster-signing-cert-file="$D/pki/ca.crt" --cluster-signing-key-file="$D/pki/ca.key" \
    --kube-api-qps=500 --kube-api-burst=1000 \
    --concurrent-deployment-syncs=20 --concurrent-replicaset-syncs=20 \
    --node-monitor-period=5s --node-monitor-grace-period=40s --v=1
  wait_for "kube-controller-manager /healthz" 60 kube-controller-manager \
    curl -fsSk "https://$IP:$(port controller-manager)/healthz"
}

start_scheduler() {
  write_kubeconfig "$D/scheduler.kubeconfig" scheduler
  cat >"$D/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $D/scheduler.kubeconfig
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
EOF
  spawn kube-scheduler "$BIN/kube-scheduler" --config="$D/scheduler.yaml" \
    --authentication-kubeconfig="$D/scheduler.kubeconfig" --authorization-kubeconfig="$D/scheduler.kubeconfig" \
    --bind-address="$IP" --secure-port="$(port scheduler)" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics --v=1
  wait_for "kube-scheduler /healthz" 60 kube-scheduler curl -fsSk "https://$IP:$(port scheduler)/healthz"
}

start_kwok() {
  write_kubeconfig "$D/kwok.kubeconfig" kwok
  spawn kwok "$BIN/kwok" --kubeconfig="$D/kwok.kubeconfig" --config="$here/kwok-stages.yaml" \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=40 --cidr=10.244.0.0/16 --node-ip=10.244.0.1 \
    --server-address="$IP:$(port kwok)" --node-port="$(port kwok)"
  # kwok has no health endpoint of its own worth trusting yet; nodes turning Ready is the real check.
  sleep 0.1
}

# Starts one component of the current plane (the start half of `restart`).
start_component() {
  case "$1" in
    etcd) start_etcd ;;
    oidc-issuer) start_oidc_issuer ;;
    kube-apiserver) start_apiserver ;;
    kube-controller-manager) start_controller_manager ;;
    kube-scheduler) start_scheduler ;;
    kwok) start_kwok ;;
    prometheus) [ "$PLANE" = hub ] || die "$PLANE has no prometheus"
      FLEETROLL_PROMETHEUS_PORT=$(port prometheus) start_prometheus ;;
    *) die "no such component: $1" ;;
  esac
}

# An optional Prometheus beside the control plane, for trying metric gates by hand: a fixed, well-known port
# (so a FleetRollout can name it), scraping itself; data in $W/prometheus. Tests start their own instead.
start_prometheus() {
  local port=${FLEETROLL_PROMETHEUS_PORT:-9090}
  if [ -f "$W/pids/prometheus.pid" ] && kill -0 "$(cat "$W/pids/prometheus.pid")" 2>/dev/null; then
    log "reusing the Prometheus that is up on 127.0.0.1:$(port prometheus)"
    return 0
  fi
  # With SO_REUSEADDR, as Prometheus binds: only a listener makes this fail, not the last run's TIME_WAITs.
  python3 -c "import socket as s; k = s.socket(); k.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1); k.bind(('127.0.0.1', $port))" 2>/dev/null ||
    die "127.0.0.1:$port is in use: stop what listens there or set FLEETROLL_PROMETHEUS_PORT"
  echo "$port" >"$W/ports/prometheus"
  cat >"$W/prometheus.yml" <<EOF
global: {scrape_interval: 5s, evaluation_interval: 5s}
scrape_configs:
  - job_name: prometheus
    static_configs: [{targets: ["127.0.0.1:$port"]}]
EOF
  spawn prometheus "$BIN/prometheus" --config.file="$W/prometheus.yml" --storage.tsdb.path="$W/prometheus" \
    --web.listen-address="127.0.0.1:$port"
  wait_for "prometheus /-/ready" 60 prometheus curl -fsS "http://127.0.0.1:$port/-/ready"
  log "prometheus up at http://127.0.0.1:$port (log: $W/logs/prometheus.log)"
}

# Creates fake nodes kwok-node-0..N-1 (idempotently) and waits until all are Ready.
ensure_nodes() {
  local n=$1 i
  {
    for ((i = 0; i < n; i++)); do
      cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "32", memory: 256Gi, pods: "1000"}
EOF
    done
  } | kubectl apply --server-side --field-manager=fleetroll-testenv -f - >/dev/null
  wait_for "$n kwok nodes Ready" 120 kwok \
    sh -c "[ \"\$('$BIN/kubectl' --kubeconfig='$KCFG' get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}' | grep -c True)\" -ge $n ]"
}

# What the chart gives a real cluster, through the chart itself: the CRDs, the admission policies that record
# each rollout's creator and hold the platform's guardrails, and the roles, as release `fleetroll` in
# fleetroll-system with no operator pods (replicaCount=0): the operator runs on this machine (make demo,
# cargo run -- operator), or in the cluster on the real node once `helm upgrade` sets an image
# (docs/src/helm.md). A release that is there already is left as it is, whoever installed it.
install_chart() {
  local h="$BIN/helm" ns=fleetroll-system
  if ! "$h" --kubeconfig="$KCFG" status fleetroll --namespace "$ns" >/dev/null 2>&1; then
    "$h" --kubeconfig="$KCFG" install fleetroll "$root/charts/fleetroll" --namespace "$ns" --create-namespace \
      --set replicaCount=0 >"$D/logs/chart.log" 2>&1 || { cat "$D/logs/chart.log" >&2; die "helm install of charts/fleetroll failed"; }
    log "chart installed as release fleetroll in $ns (CRDs, admission policies, roles; no operator pods)"
  fi
  # The admission plugin picks new policies up from its informers within a second or so: until then a
  # rollout created by hand would get no recorded creator, and be held.
  wait_for "the admission policy to record creators" 60 kube-apiserver creator_recorded
}

# A server-side dry run of a FleetRollout comes back with spec.creator filled in.
creator_recorded() {
  local got
  got=$(kubectl create --dry-run=server -o jsonpath='{.spec.creator.username}' -f - <<'EOF'
apiVersion: fleetroll.dev/v1alpha1
kind: FleetRollout
metadata: {name: creator-probe, namespace: default}
spec:
  image: registry.k8s.io/pause:3.10
  targets: {kind: Deployment, selector: {matchLabels: {probe: x}}}
EOF
  ) || return 1
  [ -n "$got" ]
}

# True when every component of the current plane runs and its apiserver is ready.
is_up() {
  [ -f "$D/ports/apiserver" ] && [ -f "$KCFG" ] || return 1
  local c
  for c in "${COMPONENTS[@]}"; do
    [ -f "$D/pids/$c.pid" ] && kill -0 "$(cat "$D/pids/$c.pid")" 2>/dev/null || return 1
  done
  curl -fsS --max-time 5 --cacert "$D/pki/ca.crt" "https://$IP:$(port apiserver)/readyz" >/dev/null 2>&1
}

# Starts the current plane from nothing (its directory must not hold a running plane) with NODES kwok nodes.
start_plane() {
  local nodes=$1 p
  mkdir -p "$D"/{pids,logs,ports}
  for p in etcd etcd-peer apiserver controller-manager scheduler kwok oidc-issuer; do free_port >"$D/ports/$p"; done
  make_pki
  start_etcd
  [ "$PLANE" != hub ] || start_oidc_issuer
  start_apiserver
  write_kubeconfig "$D/super-admin.kubeconfig" super-admin
  "$BIN/kubectl" --kubeconfig="$D/super-admin.kubeconfig" create clusterrolebinding fleetroll:cluster-admins \
    --clusterrole=cluster-admin --group=fleetroll:cluster-admins >/dev/null
  write_kubeconfig "$KCFG" admin
  wait_for "the admin's cluster-admin binding" 30 kube-apiserver kubectl auth can-i '*' '*' --all-namespaces
  start_controller_manager
  start_scheduler
  start_kwok
  ensure_nodes "$nodes"
  wait_for "the default ServiceAccount" 60 kube-controller-manager kubectl -n default get serviceaccount default
}

up() {
  local nodes=${1:-10}
  local t0=$SECONDS
  plane hub
  if is_up; then
    log "reusing the cluster that is up at $W"
    # The test tools may be newer than the cluster (a changed gitops-judge gets a new cache directory).
    tools
    ensure_nodes "$nodes"
  else
    [ ! -d "$W/pids" ] || down
    "$here/build.sh"
    t0=$SECONDS
    mkdir -p "$W"
    link_binaries
    start_plane "$nodes"
    log "cluster up in $((SECONDS - t0))s"
  fi
  install_chart
  [ "${FLEETROLL_NODE:-}" != 1 ] || node_up
  [ "${FLEETROLL_PROMETHEUS:-}" != 1 ] || start_prometheus
  up_members "${FLEETROLL_MEMBERS:-0}"
  plane hub
  kubectl version 2>/dev/null | sed 's/^/[testenv] /' >&2 || true
  env_exports
}

# What a shell needs to use the cluster: `eval "$(tests/testenv/cluster.sh env)"` (or of `make -s cluster`).
env_exports() {
  plane hub
  local registry=""
  ! node_pid_alive registry || registry=" REGISTRY=$(registry_addr)"
  echo "export KUBECONFIG=$KCFG PATH=$BIN:\$PATH$registry"
}

# Stops one component of the current plane by its PID file: TERM to the process group, KILL after 10 s.
stop() {
  local c=$1 pid
  [ -f "$D/pids/$c.pid" ] || return 0
  pid=$(cat "$D/pids/$c.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$D/pids/$c.pid"
}

# Stops the current plane's components in reverse start order.
stop_plane() {
  local i
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do stop "${COMPONENTS[$i]}"; done
}

# Stops the members and the hub (with its optional Prometheus) side by side: a plane takes about 10 s.
down() {
  local m job
  local jobs=()
  for m in $(started_members); do
    (
      plane "$m"
      stop_plane
    ) &
    jobs+=($!)
  done
  plane hub
  node_down
  stop prometheus
  stop_plane
  for job in "${jobs[@]}"; do wait "$job" || true; done
  rm -rf "$W"
  log "cluster stopped and $W removed"
}

# Stops one component by PID and starts it again with the same ports and data (for fault injection):
# COMPONENT of the hub, or member-N/COMPONENT.
restart() {
  local target=$1 c=${1##*/}
  if [ "$target" != "$c" ]; then plane "${target%%/*}"; else plane hub; fi
  is_up || die "$PLANE is not up"
  [ -f "$D/pids/$c.pid" ] || die "no such component of $PLANE: $c"
  stop "$c"
  start_component "$c"
  log "$target restarted"
}

tools() {
  "$here/build.sh"
  link_binaries
}

# Exit 0 when the hub and the requested members are up.
status() {
  plane hub
  is_up || return 1
  local m
  for m in $(requested_members); do
    plane "$m"
    is_up || {
      log "$m is not up"
      return 1
    }
  done
}

# shellcheck source=tests/testenv/members.sh
. "$here/members.sh"
# shellcheck source=tests/testenv/node.sh
. "$here/node.sh"

case "${1:-}" in
  up) up "${2:-10}" ;;
  tools) tools ;;
  down) down ;;
  status) status ;;
  restart) restart "${2:?component}" ;;
  member-secrets) member_secrets "${2:?namespace}" ;;
  env) env_exports ;;
  node-up) is_up || die "the cluster is not up"; node_up; env_exports ;;
  node-down) plane hub; node_down ;;
  *) die "usage: $0 up [NODES] | down | status | tools | env | node-up | node-down | restart [member-N/]COMPONENT | member-secrets NAMESPACE" ;;
esac
