# syntax=docker/dockerfile:1
# The fleetroll image: one static binary on an empty base, running as a non-root user.
#
#   docker build -t ghcr.io/fleetroll/fleetroll:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#
# Not built in CI: the CI machines have no Docker engine (the tests run the binary directly against a
# local control plane instead).
#
# The builder is pinned by digest, so a rebuild uses the same toolchain and musl: the multi-arch index of
# rust:1.95.0-alpine, the Rust of rust-toolchain.toml (tests/it/architecture.rs checks that they agree). The
# tag is for people; the digest is what is pulled. Bump both together.

FROM rust:1.95.0-alpine@sha256:606fd313a0f49743ee2a7bd49a0914bab7deedb12791f3a846a34a4711db7ed2 AS build
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY src ./src
# The pure core (API types and decisions), a workspace member of its own.
COPY crates ./crates
# On Alpine the target is musl: the binary is static.
RUN cargo build --release --locked && strip target/release/fleetroll

# Empty: the static binary needs no libc, no CA bundle (it trusts the cluster's CA; health checks do not
# verify certificates) and no shell.
FROM scratch
# Set by the release build; a local build says what it is not.
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fleetroll" \
      org.opencontainers.image.description="Durable, batched image rollouts across a fleet of Kubernetes workloads, driven by a FleetRollout resource and an MCP server" \
      org.opencontainers.image.source="https://github.com/fleetroll/fleetroll" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /src/target/release/fleetroll /fleetroll
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/fleetroll"]
CMD ["operator"]
