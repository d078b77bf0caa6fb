# sonde's container image: one static binary (x86_64-unknown-linux-musl) on an empty base.
#
#   docker build -t sonde .                                   # builds the binary in a Rust stage
#   docker run --rm sonde --version
#
# Without pulling any base image (an air-gapped host, or a binary built and tested elsewhere),
# build the binary on the host and let the final stage copy it (docs/deploy.md, "Container image"):
#
#   rustup target add x86_64-unknown-linux-musl && apt-get install musl-tools
#   CC_x86_64_unknown_linux_musl=musl-gcc \
#       cargo build --locked --profile dist --target x86_64-unknown-linux-musl -p sonde
#   docker build --build-arg SONDE_BINARY=host -t sonde .
#
# With SONDE_BINARY=host the Rust stage is never built (BuildKit, Docker's builder since 23.0,
# builds only the stages the final one needs), and `scratch` is no image: nothing is pulled.
# (No `# syntax=` line on purpose: it would pull the Dockerfile frontend image.) The test that
# this binary runs in an empty root, as in the image, is crates/sonde/tests/peers/deploy.rs.

# Where the binary comes from: `build` (the stage below) or `host` (target/ in the context).
ARG SONDE_BINARY=build

# The toolchain CI tests with (docs/install.md: Rust 1.89 or newer builds it).
FROM rust:1.95-slim-bookworm AS build
# musl-gcc compiles the bundled SQLite (rusqlite) and ring (the TLS of [peers] kubernetes) for the
# musl target.
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
ENV CC_x86_64_unknown_linux_musl=musl-gcc
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=sonde-target \
    cargo build --locked --profile dist --target x86_64-unknown-linux-musl -p sonde \
    && cp target/x86_64-unknown-linux-musl/dist/sonde /sonde

FROM scratch AS host
COPY target/x86_64-unknown-linux-musl/dist/sonde /sonde

FROM ${SONDE_BINARY} AS binary

FROM scratch
COPY --from=binary /sonde /sonde
# Any unprivileged numeric id: scratch has no /etc/passwd to name one. The agent binds 5300
# (above 1024) and needs no capability; the results database is not used by `sonde server`.
USER 65532:65532
# The agent's port, TCP (control and TCP data) and UDP (UDP data); the metrics endpoint
# (`--metrics 0.0.0.0:9530`, the port deploy/kubernetes uses).
EXPOSE 5300/tcp 5300/udp 9530/tcp
ENTRYPOINT ["/sonde"]
CMD ["server"]
