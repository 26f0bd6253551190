# Versions of the local control plane. One place; the cache is keyed by these.
# k8s-openapi's feature in Cargo.toml (v1_37) must match K8S_VERSION's minor.
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
# krew's manifest validator (sigs.k8s.io/krew/cmd/validate-krew-manifest), for the test of .krew.yaml.
KREW_VERSION=v0.4.3
# Generates charts/fleetroll/README.md from values.yaml's `# --` comments (make generate; checked by tests).
HELM_DOCS_VERSION=v1.14.2
# Prometheus for the metric analysis gates' tests: Go module v0.316.0 is Prometheus 3.16.0. Also required by
# tests/testenv/prometheus/go.mod (change both, then `go mod tidy` there).
PROMETHEUS_VERSION=v0.316.0
# Alertmanager for the notification sink's tests. Also required by tests/testenv/alertmanager/go.mod (change
# both, then `go mod tidy` there).
ALERTMANAGER_VERSION=v0.35.0
