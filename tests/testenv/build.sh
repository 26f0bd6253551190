#!/usr/bin/env bash
# Builds the local control plane from Go modules, once, into a cache outside the repository:
#   $FLEETROLL_CACHE/bin/<component>-<version>/
# etcd and kube-* cannot be `go install`ed (their go.mod files carry replace directives), so each is
# built from a small wrapper module in $FLEETROLL_CACHE/src. A finished build leaves a `.complete`
# stamp holding the versions the binaries reported, so a second run only checks stamps.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/testenv/versions.sh
. "$here/versions.sh"
# shellcheck source=tests/testenv/lib.sh
. "$here/lib.sh"

export GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# Records what each binary says of its own version; fails if it is not the version we built.
stamp() {
  local dir=$1 expect=$2 cmd=$3
  local got
  got=$(cd "$dir" && eval "$cmd" 2>&1 | tr '\n' ' ')
  case "$got" in
    *"$expect"*) printf '%s\n' "$got" >"$dir/.complete" ;;
    *) die "$dir: version check '$cmd' printed '$got', expected '$expect'" ;;
  esac
}

# Extracts "GoMod"/"Dir" from `go mod download -json`, without needing jq.
mod_field() { sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}$/\1/p" | head -n1; }

build_etcd() {
  local out=$CACHE/bin/etcd-$ETCD_VERSION src=$CACHE/src/etcd-$ETCD_VERSION
  [ -f "$out/.complete" ] && return 0
  log "building etcd $ETCD_VERSION"
  mkdir -p "$src" "$out"
  cat >"$src/go.mod" <<EOF
module fleetroll.invalid/etcd-bin

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

tool go.etcd.io/etcd/server/v3
EOF
  (cd "$src" && go mod tidy && go build -trimpath -ldflags '-s -w' -o "$out/etcd" go.etcd.io/etcd/server/v3)
  stamp "$out" "etcd Version: ${ETCD_VERSION#v}" './etcd --version'
}

# The version the kube binaries report (what the release's own build stamps in), from the module's info.
kube_ldflags() {
  local src=$1 info minor=${K8S_VERSION#v1.} date commit pkg ldf=""
  minor=${minor%%.*}
  info=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | mod_field Info)
  date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")
  commit=$(sed -n 's/.*"Hash":"\([^"]*\)".*/\1/p' "$info")
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X '$pkg.gitVersion=$K8S_VERSION' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
    ldf+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=${date:-unknown}' -X '$pkg.gitCommit=${commit:-unknown}'"
  done
  printf '%s' "$ldf"
}

build_kubernetes() {
  local out=$CACHE/bin/kubernetes-$K8S_VERSION src=$CACHE/src/kubernetes-$K8S_VERSION
  [ -f "$out/.complete" ] && return 0
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $K8S_VERSION (the long one)"
  mkdir -p "$src" "$out"
  local staging=v0.${K8S_VERSION#v1.}
  local upstream_mod
  upstream_mod=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | mod_field GoMod)
  [ -f "$upstream_mod" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
  {
    echo "module fleetroll.invalid/kube-bins"
    echo
    grep -E '^(go|godebug) ' "$upstream_mod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "tool ("
    for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do echo "	k8s.io/kubernetes/cmd/$c"; done
    echo ")"
    echo
    # Upstream maps every staging module to ./staging/src; point each at its published release instead.
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$upstream_mod" |
      while read -r m; do echo "	$m => $m $staging"; done
    echo ")"
  } >"$src/go.mod"
  (cd "$src" && go mod tidy)

  (cd "$src" && go build -trimpath -tags selinux,notest -ldflags "-s -w $(kube_ldflags "$src")" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  stamp "$out" "Kubernetes $K8S_VERSION Kubernetes $K8S_VERSION Kubernetes $K8S_VERSION Client Version: $K8S_VERSION" \
    './kube-apiserver --version; ./kube-controller-manager --version; ./kube-scheduler --version; ./kubectl version --client'
}

# The kubelet of the real node (tests/testenv/node.sh), from the same wrapper module and flags as the control
# plane (so a second, small build: the packages are in Go's cache), with its own stamp: the control plane does
# not need it, and a cache from before it was added is not rebuilt.
build_kubelet() {
  local out=$CACHE/bin/kubelet-$K8S_VERSION src=$CACHE/src/kubernetes-$K8S_VERSION
  [ -f "$out/.complete" ] && return 0
  [ -f "$CACHE/bin/kubernetes-$K8S_VERSION/.complete" ] || die "build the control plane first"
  log "building kubelet $K8S_VERSION"
  mkdir -p "$out"
  grep -q 'k8s.io/kubernetes/cmd/kubelet' "$src/go.mod" || (cd "$src" && go get -tool k8s.io/kubernetes/cmd/kubelet)
  (cd "$src" && go build -trimpath -tags selinux,notest -ldflags "-s -w $(kube_ldflags "$src")" -o "$out/" \
    k8s.io/kubernetes/cmd/kubelet)
  stamp "$out" "Kubernetes $K8S_VERSION" './kubelet --version'
}

# `go install`s a command once into $CACHE/bin/<name>-<version>; the stamp checks that `check`, run there,
# prints `expect`.
go_install() {
  local name=$1 version=$2 package=$3 expect=$4 check=$5
  local out=$CACHE/bin/$name-$version
  [ -f "$out/.complete" ] && return 0
  log "building $name $version"
  mkdir -p "$out"
  GOBIN=$out go install -trimpath -ldflags '-s -w' "$package@$version"
  stamp "$out" "$expect" "$check"
}

build_kwok() {
  go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "${KWOK_VERSION#v}" './kwok --version'
}

build_helm() {
  local out=$CACHE/bin/helm-$HELM_VERSION
  [ -f "$out/.complete" ] && return 0
  log "building helm $HELM_VERSION"
  mkdir -p "$out"
  local major=${HELM_VERSION%%.*} kminor=${K8S_VERSION#v1.}
  kminor=${kminor%%.*}
  local p="helm.sh/helm/$major"
  GOBIN=$out go install -trimpath -ldflags "-s -w -X $p/internal/version.version=$HELM_VERSION \
    -X $p/internal/version.gitTreeState=clean \
    -X $p/pkg/chartutil.k8sVersionMajor=1 -X $p/pkg/chartutil.k8sVersionMinor=$kminor \
    -X $p/pkg/lint/rules.k8sVersionMajor=1 -X $p/pkg/lint/rules.k8sVersionMinor=$kminor" \
    "$p/cmd/helm@$HELM_VERSION"
  stamp "$out" "$HELM_VERSION" './helm version --short'
}

# What the GitOps tools make of our objects: kstatus (cli-utils and Flux's fork), Flux's healthCheckExprs
# evaluator, and Argo CD's Lua (gopher-lua), in one small program of ours on the real libraries.
build_gitops_judge() {
  local out
  out=$(gitops_judge_dir)
  [ -f "$out/.complete" ] && return 0
  log "building gitops-judge (kstatus, Flux CEL, gopher-lua)"
  mkdir -p "$out"
  (cd "$here/gitops-judge" && go build -trimpath -ldflags '-s -w' -o "$out/gitops-judge" .)
  stamp "$out" "usage" './gitops-judge </dev/null || true'
}

# krew's own manifest validator, which the test of .krew.yaml runs. Not part of the control plane: built
# here so that the tests find it where they find kubectl and helm. It has no --version; its build info does.
build_krew_validator() {
  go_install validate-krew-manifest "$KREW_VERSION" sigs.k8s.io/krew/cmd/validate-krew-manifest \
    "sigs.k8s.io/krew	$KREW_VERSION" 'go version -m ./validate-krew-manifest | grep -w mod'
}

# helm-docs prints no version of its own (it is set at release time), so the stamp is the module version
# Go recorded in the binary.
build_helm_docs() {
  go_install helm-docs "$HELM_DOCS_VERSION" github.com/norwoodj/helm-docs/cmd/helm-docs \
    "$HELM_DOCS_VERSION" 'go version -m ./helm-docs | grep -w mod'
}

# Prometheus, for the metric analysis gates' tests (crates/fleetroll-testkit/src/prometheus.rs starts one per test; `make
# cluster PROMETHEUS=1` one beside the control plane). Its go.mod has no replace directives, but a wrapper
# module (tests/testenv/prometheus, with the go.sum) pins what it is built from. `remove_all_sd` leaves out
# the cloud service discoveries (static targets are all a test needs); the web UI's assets are not built in
# (without the `builtinassets` tag), and the API does not need them.
build_prometheus() {
  local out=$CACHE/bin/prometheus-$PROMETHEUS_VERSION src=$here/prometheus
  [ -f "$out/.complete" ] && return 0
  grep -q "github.com/prometheus/prometheus $PROMETHEUS_VERSION" "$src/go.mod" ||
    die "$src/go.mod does not require prometheus $PROMETHEUS_VERSION (versions.sh): edit it and run go mod tidy there"
  # Module v0.3XX.Y is Prometheus 3.XX.Y; the release's own VERSION file says which, for the stamp.
  local dir release
  dir=$(cd "$src" && go mod download -json "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" | mod_field Dir)
  release=$(cat "$dir/VERSION") || die "no VERSION file in prometheus $PROMETHEUS_VERSION"
  log "building prometheus $release ($PROMETHEUS_VERSION)"
  mkdir -p "$out"
  (cd "$src" && go build -tags remove_all_sd -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    -o "$out/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
  stamp "$out" "prometheus, version $release" './prometheus --version'
}

# Alertmanager, for the notification sink's tests (crates/fleetroll-testkit/src/alertmanager.rs starts one per
# test). Its ui/web.go embeds ui/app/dist unconditionally, and that npm + Elm build output is not in the module
# zip, so a plain `go build` of the module fails ("pattern app/dist: no matching files found"). It is built
# from a writable copy of the release (with the release's own go.mod and go.sum) with a placeholder page in
# each UI directory; the API and /-/ready do not use them. The wrapper module (tests/testenv/alertmanager, with
# the go.sum) pins the release zip that `go mod download` checks.
build_alertmanager() {
  local out=$CACHE/bin/alertmanager-$ALERTMANAGER_VERSION mod=$here/alertmanager
  local src=$CACHE/src/alertmanager-$ALERTMANAGER_VERSION
  [ -f "$out/.complete" ] && return 0
  grep -q "github.com/prometheus/alertmanager $ALERTMANAGER_VERSION" "$mod/go.mod" ||
    die "$mod/go.mod does not require alertmanager $ALERTMANAGER_VERSION (versions.sh): edit it and run go mod tidy there"
  local dir release d
  dir=$(cd "$mod" && go mod download -json "github.com/prometheus/alertmanager@$ALERTMANAGER_VERSION" | mod_field Dir)
  release=$(cat "$dir/VERSION") || die "no VERSION file in alertmanager $ALERTMANAGER_VERSION"
  log "building alertmanager $release ($ALERTMANAGER_VERSION)"
  rm -rf "$src" && mkdir -p "$src" "$out"
  # The module cache is read-only.
  cp -R "$dir" "$src/alertmanager" && chmod -R u+w "$src/alertmanager"
  for d in elm mantine; do
    mkdir -p "$src/alertmanager/ui/app/dist/$d"
    echo '<!-- web UI not built (fleetroll test environment) -->' >"$src/alertmanager/ui/app/dist/$d/index.html"
  done
  (cd "$src/alertmanager" && go build -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    -o "$out/alertmanager" ./cmd/alertmanager)
  stamp "$out" "alertmanager, version $release" './alertmanager --version'
}

mkdir -p "$CACHE"
start=$(date +%s)
build_etcd
build_kwok
build_helm
build_helm_docs
build_kubernetes
build_gitops_judge
build_krew_validator
build_prometheus
build_alertmanager
# `build.sh kubelet`: the real node's kubelet as well (tests/testenv/node.sh asks for it).
[ "${1:-}" != kubelet ] || build_kubelet
log "control-plane binaries and test tools ready in $CACHE/bin ($(($(date +%s) - start))s)"
