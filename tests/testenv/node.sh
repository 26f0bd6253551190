# A real node beside the hub's kwok nodes, where pods actually run: containerd + runc + a kubelet built from
# the control plane's module, and a local OCI registry (Debian's docker-registry) on 127.0.0.1 that the node
# pulls from, holding a pause image built here. Sourced by cluster.sh (`up` with FLEETROLL_NODE=1, `down`).
#
# What this machine needs (and why): root (mounts, cgroups, network namespaces); cgroup v1 is accepted
# (failCgroupV1: false); no CAP_SYS_RESOURCE, so containerd may only raise OOM scores
# (restrict_oom_score_adj); no kube-proxy, so a DNAT sends the kubernetes Service's address (10.96.0.1:443) to
# the API server on loopback, with route_localnet on the node's bridge; a node address that is not loopback,
# so the API server can reach the kubelet (kubectl logs, exec).
#
# Several clusters on one machine each get a node: a slot (0-63) under /run/fleetroll-nodes picks the
# bridge (frnode<slot>), the pod subnet (10.89.<slot>.0/24) and the cgroups (/fleetroll-node-<slot>).
# The node is named fleetroll-node, labelled fleetroll.dev/real-node=true and tainted
# fleetroll.dev/real-node=true:NoSchedule, so only pods that ask for it run there (tests/testenv/node-values.yaml).
# shellcheck shell=bash

NODE_NAME=fleetroll-node
NODE_SLOTS=/run/fleetroll-nodes
N=$W/node

# The apt packages the node is made of, by the command each provides.
node_prerequisites() {
  [ "$(id -u)" = 0 ] || die "the real node needs root (mounts, cgroups, network namespaces)"
  local missing=() entry
  for entry in containerd:containerd containerd-shim-runc-v2:containerd runc:runc docker-registry:docker-registry \
    skopeo:skopeo iptables:iptables musl-gcc:musl-tools ip:iproute2; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry##*:}")
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
    missing+=(containernetworking-plugins)
  [ ${#missing[@]} -eq 0 ] || die "the real node needs: apt-get install ${missing[*]}"
}

node_pid_alive() { [ -f "$W/pids/$1.pid" ] && kill -0 "$(cat "$W/pids/$1.pid")" 2>/dev/null; }

# The registry, on a free port of 127.0.0.1, storing under $W/registry.
start_registry() {
  if node_pid_alive registry; then return 0; fi
  [ -f "$W/ports/registry" ] || free_port >"$W/ports/registry"
  local addr=127.0.0.1:$(port registry)
  mkdir -p "$W/registry"
  cat >"$W/registry.yml" <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $W/registry}
  delete: {enabled: true}
http: {addr: $addr}
EOF
  spawn registry docker-registry serve "$W/registry.yml"
  wait_for "the registry at $addr" 30 registry curl -fsS "http://$addr/v2/"
}

registry_addr() { echo "127.0.0.1:$(port registry)"; }

# The pod sandbox's image, REGISTRY/pause:3.10: tests/testenv/node/pause.c, static, in an image written by
# hack/oci-image.py (no container engine), pushed with skopeo.
push_pause_image() {
  local out=$N/pause
  mkdir -p "$out"
  musl-gcc -static -Os -o "$out/pause" "$here/node/pause.c"
  python3 "$root/hack/oci-image.py" --out "$out/image" --tag 3.10 --name pause --file "$out/pause=/pause" \
    --entrypoint /pause --user 65535:65535 --epoch 0 >/dev/null
  skopeo copy --quiet --dest-tls-verify=false "oci:$out/image:3.10" "docker://$(registry_addr)/pause:3.10" \
    >"$W/logs/skopeo.log" 2>&1 || { cat "$W/logs/skopeo.log" >&2; die "pushing the pause image failed"; }
}

# Claims a free slot (mkdir is atomic); a slot whose owner's containerd is gone is cleaned and taken.
claim_slot() {
  [ ! -f "$N/slot" ] || return 0
  mkdir -p "$NODE_SLOTS"
  local k owner
  for ((k = 0; k < 64; k++)); do
    if [ -d "$NODE_SLOTS/$k" ]; then
      owner=$(cat "$NODE_SLOTS/$k/owner" 2>/dev/null || true)
      [ -n "$owner" ] && [ -f "$owner/pids/containerd.pid" ] && kill -0 "$(cat "$owner/pids/containerd.pid")" 2>/dev/null &&
        continue
      release_slot "$k"
    fi
    if mkdir "$NODE_SLOTS/$k" 2>/dev/null; then
      echo "$W" >"$NODE_SLOTS/$k/owner"
      mkdir -p "$N"
      echo "$k" >"$N/slot"
      return 0
    fi
  done
  die "all 64 node slots in $NODE_SLOTS are taken"
}

slot() { cat "$N/slot"; }

cgroup_controllers() {
  local c
  for c in /sys/fs/cgroup/*; do
    [ "${c##*/}" != unified ] && mountpoint -q "$c" && echo "$c"
  done
}

# The node's cgroups: /fleetroll-node-K (the kubelet's cgroupRoot: pods) and /fleetroll-node-K-runtime
# (containerd and its shims), in every v1 controller, so that `down` finds every process the node started.
make_cgroups() {
  local k=$1 c g
  for c in $(cgroup_controllers); do
    for g in "fleetroll-node-$k" "fleetroll-node-$k-runtime"; do
      mkdir -p "$c/$g"
      if [ "${c##*/}" = cpuset ]; then
        cat "$c/cpuset.cpus" >"$c/$g/cpuset.cpus"
        cat "$c/cpuset.mems" >"$c/$g/cpuset.mems"
      fi
    done
  done
}

# Kills every process in the slot's cgroups and removes them.
remove_cgroups() {
  local k=$1 c g pid deadline=$((SECONDS + 10))
  for g in /sys/fs/cgroup/pids/fleetroll-node-"$k" /sys/fs/cgroup/pids/fleetroll-node-"$k"-runtime; do
    [ -d "$g" ] || continue
    # Killed processes leave cgroup.procs when they are reaped: until then rmdir fails (EBUSY).
    while pid=$(find "$g" -name cgroup.procs -exec cat {} + 2>/dev/null) && [ -n "$pid" ]; do
      # shellcheck disable=SC2086
      kill -KILL $pid 2>/dev/null || true
      [ $SECONDS -lt $deadline ] || { log "processes of $g would not die: $pid"; break; }
      sleep 0.1
    done
  done
  for c in $(cgroup_controllers); do
    for g in "$c/fleetroll-node-$k" "$c/fleetroll-node-$k-runtime"; do
      [ ! -d "$g" ] || find "$g" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
}

# The slot's host network: its bridge (pre-created, so route_localnet is on before the first pod) and the
# DNAT of the kubernetes Service to the API server.
make_network() {
  local k=$1 br=frnode$1
  ip link show "$br" >/dev/null 2>&1 || ip link add "$br" type bridge
  ip link set "$br" up
  sysctl -qw "net.ipv4.conf.$br.route_localnet=1"
  iptables -t nat -A PREROUTING -s "10.89.$k.0/24" -d 10.96.0.1/32 -p tcp --dport 443 \
    -m comment --comment "fleetroll-node-$k" -j DNAT --to-destination "127.0.0.1:$(port apiserver)"
}

remove_network() {
  local k=$1 rule
  iptables -t nat -S PREROUTING 2>/dev/null | { grep -E -- "--comment \"?fleetroll-node-$k\"? " || true; } |
    sed 's/^-A /-D /' | while read -r rule; do eval "iptables -t nat $rule" || true; done
  ip link del "frnode$k" 2>/dev/null || true
}

release_slot() {
  local k=$1
  remove_cgroups "$k"
  remove_network "$k"
  rm -rf "${NODE_SLOTS:?}/$k"
}

start_containerd() {
  local k
  k=$(slot)
  mkdir -p "$N"/{containerd,cni,cni-ipam,certs.d/"$(registry_addr)"}
  cat >"$N/certs.d/$(registry_addr)/hosts.toml" <<EOF
server = "http://$(registry_addr)"
[host."http://$(registry_addr)"]
  capabilities = ["pull", "resolve"]
EOF
  # FLEETROLL_NODE_CNI_CONFLIST: a CNI network of your own instead of this bridge (the install test gives
  # one that cannot load, to see that a node that never becomes Ready is reported with its cause).
  if [ -n "${FLEETROLL_NODE_CNI_CONFLIST:-}" ]; then
    cp "$FLEETROLL_NODE_CNI_CONFLIST" "$N/cni/10-fleetroll.conflist"
  else
    cat >"$N/cni/10-fleetroll.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "fleetroll-node", "plugins": [
  {"type": "bridge", "bridge": "frnode$k", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.$k.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$N/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  fi
  cat >"$N/containerd.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$N/containerd.sock"
[ttrpc]
  address = "$N/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(registry_addr)/pause:3.10"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$N/certs.d"
EOF
  # Into its cgroups before exec, so its shims and their containers are found there by `down`.
  spawn containerd sh -c 'for c in "$@"; do echo $$ >"$c/cgroup.procs"; done; exec containerd --config "$0"' \
    "$N/containerd.toml" $(for c in $(cgroup_controllers); do echo "$c/fleetroll-node-$k-runtime"; done)
  wait_for "containerd" 30 containerd ctr --address "$N/containerd.sock" version
}

# The node's address: the first IPv4 address that is not loopback (the API server dials the kubelet there).
node_ip() {
  local ip
  ip=$(host_ip)
  [ -n "$ip" ] || die "the real node needs an IPv4 address that is not loopback (the API server dials the kubelet there)"
  echo "$ip"
}

start_kubelet() {
  local k ip p=$D/pki
  k=$(slot)
  ip=$(node_ip)
  mkdir -p "$N"/{kubelet,pod-logs}
  [ -f "$W/ports/kubelet" ] || { free_port >"$W/ports/kubelet"; free_port >"$W/ports/kubelet-healthz"; }
  # The node's client certificate (the Node authorizer knows system:node:<name> in system:nodes) and its
  # serving certificate for the API server's connections.
  cert node "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,IP:$ip"
  write_kubeconfig "$N/kubelet.kubeconfig" node
  cat >"$N/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
cgroupRoot: /fleetroll-node-$k
containerRuntimeEndpoint: unix://$N/containerd.sock
address: $ip
port: $(port kubelet)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(port kubelet-healthz)
tlsCertFile: $p/kubelet-serving.crt
tlsPrivateKeyFile: $p/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $N/pod-logs
makeIPTablesUtilChains: false
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# A test machine's disk is shared with builds: evict only when it is really full, and keep every image.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerWithTaints: [{key: fleetroll.dev/real-node, value: "true", effect: NoSchedule}]
EOF
  spawn kubelet "$BIN/kubelet" --config="$N/kubelet.yaml" --kubeconfig="$N/kubelet.kubeconfig" \
    --root-dir="$N/kubelet" --hostname-override="$NODE_NAME" --node-ip="$ip" \
    --node-labels=fleetroll.dev/real-node=true,type=real --v=1
}

# Waits for the node to be Ready; a kubelet or containerd that exits, or a deadline, fails with the cause
# (the log's tail, or the Ready condition's reason and message), not a bare timeout.
wait_node_ready() {
  local seconds=${FLEETROLL_NODE_READY_TIMEOUT:-120} deadline c ready
  deadline=$((SECONDS + seconds))
  while :; do
    ready=$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
    [ "$ready" != True ] || return 0
    for c in containerd kubelet; do
      node_pid_alive "$c" || { tail -n 30 "$W/logs/$c.log" >&2; die "the real node's $c exited (log: $W/logs/$c.log)"; }
    done
    if [ $SECONDS -ge $deadline ]; then
      local why
      why=$(kubectl get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}' 2>/dev/null || true)
      [ -n "$why" ] || why="it never registered (kubelet log: $W/logs/kubelet.log)"
      die "node $NODE_NAME not Ready after ${seconds}s: $why"
    fi
    sleep 0.5
  done
}

node_up() {
  plane hub
  node_prerequisites
  if node_pid_alive kubelet && node_pid_alive containerd; then
    log "reusing the real node that is up (registry $(registry_addr))"
    start_registry
    return 0
  fi
  "$here/build.sh" kubelet
  ln -sf "$CACHE/bin/kubelet-$K8S_VERSION/kubelet" "$BIN/kubelet"
  local t0=$SECONDS
  start_registry
  claim_slot
  push_pause_image
  make_cgroups "$(slot)"
  make_network "$(slot)"
  start_containerd
  # The API server's credentials for the kubelet's API (logs, exec, port-forward).
  kubectl create clusterrolebinding fleetroll-testenv:kubelet-client --clusterrole=system:kubelet-api-admin \
    --user=kube-apiserver-kubelet-client --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  # A Node object left by an earlier node here is stale (its Ready condition too, until the controller
  # notices): the kubelet registers afresh.
  kubectl delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null
  start_kubelet
  wait_node_ready
  log "real node $NODE_NAME Ready in $((SECONDS - t0))s (slot $(slot), registry $(registry_addr))"
}

# Stops the node and removes all it made: pods' processes, mounts, network, cgroups, the slot; then the
# registry. Safe to run when none is up.
node_down() {
  if [ -f "$N/slot" ]; then
    local k
    k=$(slot)
    stop kubelet
    stop containerd
    remove_cgroups "$k"
    awk -v n="$N/" 'index($2, n) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done
    find /var/log/containers -maxdepth 1 -lname "$N/*" -delete 2>/dev/null || true
    release_slot "$k"
    rm -rf "$N"
  fi
  stop registry
}
