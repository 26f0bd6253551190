# syntax=docker/dockerfile:1
# The fleetroll image: one static binary on an empty base, running as a non-root user.
#
#   docker build -t ghcr.io/fleetroll/fleetroll:0.1.0 .
#
# Not built in CI: the CI machines have no Docker engine (the tests run the binary directly against a
# local control plane instead).

FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY src ./src
# On Alpine the target is musl: the binary is static.
RUN cargo build --release --locked && strip target/release/fleetroll

FROM scratch
COPY --from=build /src/target/release/fleetroll /fleetroll
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/fleetroll"]
CMD ["operator"]
