#!/usr/bin/env bash
# Builds the runtime image from a static release binary, without pulling anything:
#   scripts/build-images.sh [TAG]        (default wasmless/runtime:0.1.0)
# The binary is linked statically against glibc (static-pie, `crt-static`), so the
# image's scratch base needs nothing else. Needs buildah (scripts/setup.sh installs it);
# vfs storage and chroot isolation work without a container engine.
# Dockerfile.operator and Dockerfile.builder build in a registry-connected environment:
#   buildah bud -f Dockerfile.operator -t wasmless/operator:0.1.0 .
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-wasmless/runtime:0.1.0}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
triple=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --target "$triple" -p wasmless-runtime
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$CARGO_TARGET_DIR/$triple/release/wasmless-runtime" "$context/"
strip "$context/wasmless-runtime" || true
buildah --storage-driver vfs bud --isolation chroot -f Dockerfile.runtime -t "$tag" "$context"
