#!/usr/bin/env bash
# `make image`: the operator's image, without a container engine, the same bytes for the same commit. The
# static (musl) release binary `make image-binary` built, on an empty base, as user 65532 (non-root), with
# the OCI labels and, attached as BuildKit's `--sbom --provenance` attach them, an SPDX SBOM of the crates in
# the binary and a SLSA provenance (hack/oci-image.py). Written as an OCI layout to target/image/fleetroll;
# with REGISTRY set (what `make cluster NODE=1` prints), pushed there as $REGISTRY/fleetroll:VERSION, over TLS
# unless REGISTRY_TLS=false.
#
# IMAGE_VERSION (the crate's version) is the tag and the version label. Prints IMAGE=repository@digest: the
# reference to deploy, by digest (docs/src/helm.md).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=x86_64-unknown-linux-musl
bin=target/$target/release/fleetroll
out=target/image/fleetroll
[ -x "$bin" ] || { echo "no $bin: run make image-binary first" >&2; exit 1; }
version=${IMAGE_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)}
revision=$(git rev-parse HEAD)
# A build of uncommitted changes says so: its revision label is not the commit's.
git diff --quiet HEAD -- src crates Cargo.toml Cargo.lock || revision=$revision-dirty
epoch=$(git log -1 --format=%ct)
source=https://github.com/fleetroll/fleetroll
digest=$(python3 hack/oci-image.py --out "$out" --tag "$version" --name fleetroll \
  --file "$bin=/fleetroll" --file "LICENSE=/LICENSE" \
  --entrypoint /fleetroll --cmd operator --user 65532:65532 --port 8080/tcp --port 9090/tcp --epoch "$epoch" \
  --label org.opencontainers.image.title=fleetroll \
  --label "org.opencontainers.image.description=Durable, batched image rollouts across a fleet of Kubernetes workloads, driven by a FleetRollout resource and an MCP server" \
  --label "org.opencontainers.image.source=$source" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)" \
  --sbom-cargo Cargo.toml --sbom-target "$target" \
  --provenance "source=git+$source" --provenance "revision=$revision" --provenance "target=$target" \
  --provenance profile=release --provenance "rustc=$(rustc --version)" --provenance "command=make image")
echo "wrote $out ($digest)" >&2
if [ -n "${REGISTRY:-}" ]; then
  # --preserve-digests: the registry holds exactly these bytes (a conversion would change the digest).
  # REGISTRY_TLS=false (the Makefile's, for a registry on this machine): plain HTTP.
  skopeo copy --quiet --all --preserve-digests --dest-tls-verify="${REGISTRY_TLS:-true}" \
    "oci:$out:$version" "docker://$REGISTRY/fleetroll:$version" >&2
  echo "IMAGE=$REGISTRY/fleetroll@$digest"
else
  echo "IMAGE=fleetroll@$digest (set REGISTRY to push it)"
fi
