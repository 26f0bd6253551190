# fleetroll: `make demo` and `make test` are the two commands a newcomer needs (see README.md).
SHELL := /bin/bash
NODES ?= 10
# Member clusters beside the hub (tests/testenv/members.sh), for rollouts across clusters.
MEMBERS ?= $(or $(FLEETROLL_MEMBERS),2)
CARGO ?= cargo
TESTENV := tests/testenv
# The local control plane's helm (tests/testenv builds it), for the targets that package the chart.
HELM ?= $(or $(FLEETROLL_TESTENV),target/testenv)/bin/helm

.PHONY: demo demo-operator demo-down all build dashboard dashboard-check generate docs fmt fmt-check lint unit integration test bench chaos testenv mcp-tools cluster cluster-down clean help

all: build

.DEFAULT_GOAL := help

demo: ## the whole product on a local cluster: fleet, operator, a rollout started over MCP, watched live
	@hack/demo.sh

demo-operator: ## (re)start the demo's operator, e.g. after killing it
	@hack/demo.sh operator

demo-down: ## stop the demo's operator and the local cluster
	@hack/demo.sh down

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build the fleetroll binary
	$(CARGO) build --locked

# The dashboard's page: TypeScript (dashboard/src) compiled by the pinned tsc into src/plugin/dashboard/assets,
# which the binary embeds; the .js there is generated and committed, so building fleetroll needs no Node.
DASHBOARD_ASSETS := src/plugin/dashboard/assets
dashboard: ## rebuild the dashboard's JavaScript (src/plugin/dashboard/assets/*.js) from dashboard/src/*.ts
	cd dashboard && npm ci --no-audit --no-fund --silent && npx tsc -p .

dashboard-check: ## check the committed dashboard JavaScript is what dashboard/src builds, and that no page code uses innerHTML, eval and the like
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	(cd dashboard && npm ci --no-audit --no-fund --silent && npx tsc -p . --outDir "$$tmp") && fail=0 && \
	for f in "$$tmp"/*.js; do cmp -s "$$f" $(DASHBOARD_ASSETS)/$${f##*/} || { echo "$(DASHBOARD_ASSETS)/$${f##*/} is not what dashboard/src builds"; fail=1; }; done && \
	for f in $(DASHBOARD_ASSETS)/*.js; do b=$${f##*/}; [ -f "dashboard/src/$${b%.js}.ts" ] || { echo "$$f has no source dashboard/src/$${b%.js}.ts"; fail=1; }; done && \
	if grep -nE 'innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function' dashboard/src/*.ts $(DASHBOARD_ASSETS)/*.js; then \
	  echo "the dashboard renders cluster data as text only: no HTML from strings, no eval"; fail=1; fi && \
	if [ $$fail -ne 0 ]; then echo "run make dashboard (and commit the result)"; exit 1; fi

generate: ## regenerate the CRDs (crds/, the chart) and the manual's reference pages from the Rust types, manifests/install.yaml and the chart's README from the chart
	$(CARGO) run --locked --quiet -- crd > crds/fleetroll.dev_fleetrollouts.yaml
	$(CARGO) run --locked --quiet -- crd --policy > crds/fleetroll.dev_fleetrolloutpolicies.yaml
	$(CARGO) run --locked --quiet -- crd --helm > charts/fleetroll/templates/crds.yaml
	$(CARGO) run --locked --quiet -- reference crd > docs/src/reference/fleetrollout.md
	$(CARGO) run --locked --quiet -- reference policy > docs/src/reference/fleetrolloutpolicy.md
	$(CARGO) run --locked --quiet -- reference cli > docs/src/reference/cli.md
	$(TESTENV)/build.sh
	hack/render-manifests.sh > manifests/install.yaml
	hack/chart-readme.sh > charts/fleetroll/README.md

# The link check needs no cluster (built with the features `integration` uses, so the library builds once);
# the pinned mdbook is installed once into the cache (hack/docs.sh).
docs: ## check the manual's links, then build it (docs/) into target/book
	$(CARGO) test --locked --quiet --features conformance --test it -- docs::
	hack/docs.sh

fmt: ## format the code
	$(CARGO) fmt

fmt-check:
	$(CARGO) fmt --check

# --workspace: the core crate too, whose clippy.toml forbids reading a clock (crates/fleetroll-core).
lint: dashboard-check ## clippy, warnings are errors (the release build, and the test build with the conformance fixtures)
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked --workspace --all-targets --features conformance -- -D warnings

unit: ## unit tests of both crates, the operator and its core (no cluster needed)
	$(CARGO) test --locked --workspace --lib --bins

# The conformance feature builds in the MCP conformance suite's fixture tools, which tests/it/mcp_conformance.rs
# needs. `--test '*'`: tests/it (every libtest test, one binary) and the smoke runs of bench, chaos, security.
# The real-node install test runs beside the others, as a process of its own (hack/integration.sh).
integration: mcp-tools ## integration tests on a real control plane (starts one if none is up, stops it afterwards)
	$(CARGO) build --locked --tests --features conformance
	NODES=$(NODES) MEMBERS=$(MEMBERS) CARGO=$(CARGO) hack/integration.sh

test: fmt-check lint unit docs integration ## everything CI runs

bench: mcp-tools ## benchmarks against the floor, side by side; writes bench/results/ (about 25 min)
	$(CARGO) build --locked --release --bins --test $@
	NODES=$(NODES) MEMBERS=$(MEMBERS) $(TESTENV)/with-cluster.sh $(CARGO) test --locked --release --test bench -- --full

chaos: mcp-tools ## fault injection with invariants checked; writes bench/results/chaos.md (about 6 min)
	$(CARGO) build --locked --release --bins --test $@
	NODES=$(NODES) MEMBERS=$(MEMBERS) $(TESTENV)/with-cluster.sh $(CARGO) test --locked --release --test chaos -- --full

mcp-tools: ## install the real MCP clients the tests drive (Python mcp SDK, conformance suite on Node 22)
	@tests/mcp/install.sh >/dev/null

testenv: ## build the control-plane binaries and test tools into the cache (once), linked into target/testenv/bin
	$(TESTENV)/cluster.sh tools

# PROMETHEUS=1 (or FLEETROLL_PROMETHEUS=1 in the environment) also starts a Prometheus on 127.0.0.1:9090.
PROMETHEUS ?= $(FLEETROLL_PROMETHEUS)
# NODE=1 (or FLEETROLL_NODE=1) adds a real node (containerd + kubelet, as root) and a local OCI registry.
NODE ?= $(FLEETROLL_NODE)
cluster: ## start the local control plane (NODES=10 kwok nodes, MEMBERS=2 member clusters) or reuse the one that is up; PROMETHEUS=1 adds Prometheus on :9090, NODE=1 a real node and a registry
	@FLEETROLL_NODE=$(NODE) FLEETROLL_PROMETHEUS=$(PROMETHEUS) FLEETROLL_MEMBERS=$(MEMBERS) $(TESTENV)/cluster.sh up $(NODES)

# The image's binary: static (musl), release, symbols stripped and build paths remapped, so it is the same
# for the same commit wherever it is built.
IMAGE_TARGET := x86_64-unknown-linux-musl
.PHONY: image image-binary chart-push
image-binary: ## the static (musl) release binary the image holds
	CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C strip=symbols --remap-path-prefix=$(CURDIR)=/fleetroll --remap-path-prefix=$(or $(CARGO_HOME),$(HOME)/.cargo)=/cargo" \
	  $(CARGO) build --release --locked --target $(IMAGE_TARGET) --bin fleetroll

# Plain HTTP only to a registry on this machine (make cluster NODE=1's); TLS, verified, anywhere else.
REGISTRY_TLS = $(if $(filter 127.0.0.1:% localhost:% [::1]:%,$(REGISTRY)),false,true)

image: image-binary ## the operator's image without a container engine (target/image/fleetroll); pushed to $$REGISTRY when set
	@REGISTRY_TLS=$(REGISTRY_TLS) hack/image.sh

chart-push: ## the chart as an OCI artifact in $$REGISTRY (oci://$$REGISTRY/charts/fleetroll)
	@test -n "$$REGISTRY" || { echo "set REGISTRY (make cluster NODE=1 prints it)"; exit 1; }
	rm -rf target/chart && $(HELM) package charts/fleetroll -d target/chart >/dev/null
	$(HELM) push target/chart/fleetroll-*.tgz oci://$$REGISTRY/charts $(if $(filter false,$(REGISTRY_TLS)),--plain-http)

cluster-down: ## stop the local control plane (its members and Prometheus too) and remove its state
	@$(TESTENV)/cluster.sh down

clean: cluster-down
	$(CARGO) clean

# The kubectl plugin archive .krew.yaml names, for the platform this runs on: a release runs it on each of
# linux and darwin, amd64 and arm64, and uploads the archives to the GitHub release of TAG.
TAG ?= v$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
DIST_OS := $(shell uname -s | tr A-Z a-z)
DIST_ARCH := $(shell uname -m | sed 's/^x86_64$$/amd64/; s/^aarch64$$/arm64/')
DIST := dist/kubectl-fleetroll_$(TAG)_$(DIST_OS)_$(DIST_ARCH).tar.gz
.PHONY: dist
dist: ## the kubectl plugin archive of this platform for krew (dist/kubectl-fleetroll_TAG_OS_ARCH.tar.gz)
	$(CARGO) build --release --locked
	rm -rf dist/stage && mkdir -p dist/stage
	cp target/release/fleetroll dist/stage/kubectl-fleetroll
	cp LICENSE dist/stage/LICENSE
	tar -C dist/stage -czf $(DIST) kubectl-fleetroll LICENSE
	rm -rf dist/stage
	@echo $(DIST)
