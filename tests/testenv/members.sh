# Member clusters beside the hub, for fleetroll's rollouts across clusters; sourced by cluster.sh, whose
# plane functions it drives. Member N is a whole control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok with MEMBER_NODES fake nodes) on 127.0.0.(1+N), with its own CA and ServiceAccount
# signing key, so no hub credential works on it; its state is $W/members/member-N/, laid out as the hub's.
#
# The hub reaches members through Secrets written in the two conventions users already have:
#   odd N:  Argo CD    Secret cluster-member-N (label argocd.argoproj.io/secret-type=cluster and the cluster's
#                      labels; keys name, server, config = {"bearerToken", "tlsClientConfig": {"caData"}})
#   even N: Cluster API Secret member-N-kubeconfig (type cluster.x-k8s.io/secret, label
#                      cluster.x-k8s.io/cluster-name=member-N, key value = a kubeconfig) and a Cluster
#                      member-N carrying the cluster's labels (CRD: capi-cluster-crd.yaml)
# Labels: member-1 env=canary region=eu, member-2 env=prod region=us, further ones env=prod and region eu
# (odd) or us (even). The credential is a token of ServiceAccount fleetroll-system/fleetroll, bound to the
# ClusterRole of member-rbac.yaml.
# shellcheck shell=bash

MEMBER_NODES=3
MEMBERS_NAMESPACE=fleetroll-members
# A year: the Secrets outlive any test run. Tests that rotate tokens make their own (crates/fleetroll-testkit/src/members.rs).
MEMBER_TOKEN_DURATION=8760h

# Where cluster.sh and the manifests are (cluster.sh sets it).
TESTENV_DIR=${here:?members.sh is sourced by cluster.sh}

hub_kubectl() { "$BIN/kubectl" --kubeconfig="$W/kubeconfig" "$@"; }

# The members `up` started (those with a state directory), in order.
started_members() {
  local d
  [ -d "$W/members" ] || return 0
  for d in "$W"/members/member-*; do
    if [ -d "$d" ]; then basename "$d"; fi
  done | sort -t- -k2 -n
}

# The members `status` checks: member-1..FLEETROLL_MEMBERS when set, else those `up` started.
requested_members() {
  local n=${FLEETROLL_MEMBERS:-} i
  if [ -z "$n" ]; then
    started_members
    return 0
  fi
  for ((i = 1; i <= n; i++)); do echo "member-$i"; done
}

# Brings member-1..N up: those up are reused, the others (re)started side by side. Then (re)writes their
# Secrets into the hub's $MEMBERS_NAMESPACE.
up_members() {
  local n=$1 i t0=$SECONDS failed=0 job
  local jobs=()
  [ "$n" -gt 0 ] || return 0
  for ((i = 1; i <= n; i++)); do
    plane "member-$i"
    if is_up; then
      log "reusing $PLANE at $IP"
      ensure_nodes "$MEMBER_NODES"
      continue
    fi
    stop_plane
    rm -rf "$D"
    # Started side by side: they wait mostly on each other's start-up, not on the CPU.
    (start_plane "$MEMBER_NODES") &
    jobs+=($!)
  done
  for job in "${jobs[@]}"; do wait "$job" || failed=1; done
  [ "$failed" = 0 ] || die "a member failed to start: see the logs under $W/members/*/logs"
  [ ${#jobs[@]} = 0 ] || log "${#jobs[@]} member(s) up in $((SECONDS - t0))s"
  member_secrets "$MEMBERS_NAMESPACE"
}

# Labels of member N: "env region".
member_labels() {
  case "$1" in
    1) echo "canary eu" ;;
    2) echo "prod us" ;;
    *) if (($1 % 2)); then echo "prod eu"; else echo "prod us"; fi ;;
  esac
}

# Writes every started member's Secret (and Cluster, for the Cluster API ones) into NAMESPACE of the hub.
member_secrets() {
  local ns=$1 m n token ca server env region
  plane hub
  is_up || die "the hub is not up"
  hub_kubectl create namespace "$ns" --dry-run=client -o yaml | hub_kubectl apply --server-side -f - >/dev/null
  hub_kubectl apply --server-side --field-manager=fleetroll-testenv -f "$TESTENV_DIR/capi-cluster-crd.yaml" >/dev/null
  hub_kubectl wait --for=condition=Established crd/clusters.cluster.x-k8s.io --timeout=60s >/dev/null
  for m in $(started_members); do
    plane "$m"
    is_up || die "$m is not up"
    kubectl apply --server-side --field-manager=fleetroll-testenv -f "$TESTENV_DIR/member-rbac.yaml" >/dev/null
    token=$(kubectl -n fleetroll-system create token fleetroll --duration="$MEMBER_TOKEN_DURATION")
    ca=$(base64 -w0 <"$D/pki/ca.crt")
    server=https://$IP:$(port apiserver)
    n=${m#member-}
    read -r env region <<<"$(member_labels "$n")"
    if ((n % 2)); then
      argo_secret "$ns" "$m" "$server" "$ca" "$token" "$env" "$region"
    else
      capi_secret "$ns" "$m" "$server" "$ca" "$token" "$env" "$region"
    fi | hub_kubectl apply --server-side --force-conflicts --field-manager=fleetroll-testenv -f - >/dev/null
  done
  plane hub
  log "member Secrets written into namespace $ns of the hub"
}

b64() { printf '%s' "$1" | base64 -w0; }

# argo_secret NAMESPACE NAME SERVER CA_BASE64 TOKEN ENV REGION: the manifest, on stdout.
argo_secret() {
  local config
  config="{\"bearerToken\": \"$5\", \"tlsClientConfig\": {\"caData\": \"$4\"}}"
  cat <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: cluster-$2
  namespace: $1
  labels:
    argocd.argoproj.io/secret-type: cluster
    env: $6
    region: $7
type: Opaque
data:
  name: $(b64 "$2")
  server: $(b64 "$3")
  config: $(b64 "$config")
EOF
}

# capi_secret NAMESPACE NAME SERVER CA_BASE64 TOKEN ENV REGION: the Secret and the Cluster, on stdout.
capi_secret() {
  local hostport=${3#https://}
  cat <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: $2-kubeconfig
  namespace: $1
  labels:
    cluster.x-k8s.io/cluster-name: $2
type: cluster.x-k8s.io/secret
data:
  value: $(capi_kubeconfig "$2" "$3" "$4" "$5" | base64 -w0)
---
apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata:
  name: $2
  namespace: $1
  labels:
    env: $6
    region: $7
spec:
  controlPlaneEndpoint:
    host: ${hostport%:*}
    port: ${hostport##*:}
EOF
}

# capi_kubeconfig NAME SERVER CA_BASE64 TOKEN
capi_kubeconfig() {
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: $1
    cluster:
      server: $2
      certificate-authority-data: $3
users:
  - name: fleetroll
    user:
      token: $4
contexts:
  - name: fleetroll@$1
    context:
      cluster: $1
      user: fleetroll
current-context: fleetroll@$1
EOF
}
