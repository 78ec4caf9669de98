# The builder image: `wasmless-builder` with the compilers it drives, all offline.
#   - Go (GOOS=wasip1) for Goless handlers, with the Go SDK (standard library only);
#   - Rust with wasm32-wasip2, with wasmless-sdk and its dependencies vendored, so a
#     build Job reaches no registry unless the handler has dependencies of its own (then
#     the operator's WASMLESS_CARGO_REGISTRY or WASMLESS_GOPROXY, set on the Job).
#   buildah bud -f Dockerfile.builder -t wasmless/builder:0.1.0 .
# Not built in this repository's CI (it needs base images from a container registry).

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p wasmless-builder --bin wasmless-builder \
 && install -m 0555 target/release/wasmless-builder /usr/local/bin/wasmless-builder
# Vendor the Rust SDK's dependencies for offline handler builds.
RUN mkdir -p /opt/wasmless/vendor \
 && cd sdk/rust && cargo vendor --locked /opt/wasmless/vendor > /opt/wasmless/vendor-config.toml \
 && cp -r /src/sdk /opt/wasmless/sdk

FROM docker.io/library/golang:1.24-bookworm AS go

FROM docker.io/library/rust:1.95-slim-bookworm
RUN rustup target add wasm32-wasip2 wasm32-wasip1 \
 && rm -rf /usr/local/rustup/toolchains/*/share/doc
COPY --from=go /usr/local/go /usr/local/go
COPY --from=build /usr/local/bin/wasmless-builder /usr/local/bin/wasmless-builder
COPY --from=build /opt/wasmless /opt/wasmless
# Go's cache seed: the builder run once on a sample handler (scripts/build-images.sh's
# go_cache_seed does the same from this machine's build).
COPY scripts/go-cache-seed-handler.go /tmp/seed/handler.go
RUN PATH=/usr/local/go/bin:$PATH HOME=/tmp WASMLESS_BUILD_CACHE=/tmp/seed/cache WASMLESS_COMPILER_CACHES_IN_CACHE_DIR=true \
    wasmless-builder build --language go --source /tmp/seed/handler.go --output /tmp/seed/handler.wasm \
      --no-code --termination-log /dev/null \
 && mkdir -p /opt/wasmless && mv /tmp/seed/cache/go-build /opt/wasmless/go-build-seed && rm -rf /tmp/seed
ENV PATH=/usr/local/go/bin:/usr/local/cargo/bin:$PATH \
    GOFLAGS=-mod=mod \
    GOPROXY=off \
    GOTOOLCHAIN=local \
    CARGO_NET_OFFLINE=true \
    WASMLESS_SDK_DIR=/opt/wasmless/sdk \
    WASMLESS_VENDOR_DIR=/opt/wasmless/vendor \
    WASMLESS_GO_CACHE_SEED=/opt/wasmless/go-build-seed \
    HOME=/tmp
# The Job mounts writable emptyDirs at /tmp and /work, and the persistent build cache (Go's and
# Cargo's caches, built modules and their compiled code) at /cache; the root filesystem stays
# read-only. Go's standard library as the builder compiles it (its `-overlay` changes package
# runtime, so every standard package's cache key is the builder's own) is in the seed made
# above, which the builder copies into an empty GOCACHE: a node's or a namespace's first build
# compiles the handler only.
USER 65532:65532
WORKDIR /work
ENTRYPOINT ["/usr/local/bin/wasmless-builder"]
