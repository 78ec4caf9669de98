#!/usr/bin/env bash
# Sets up what is missing, builds the `wasmless` CLI, and runs `wasmless dev` on a
# function: it builds the function to WebAssembly once, serves it on
# http://localhost:8080 (metrics on http://localhost:9090/metrics), and rebuilds and
# swaps it in whenever its source changes.
#   scripts/dev.sh examples/hello-go        then: curl localhost:8080
set -euo pipefail
cd "$(dirname "$0")/.."

WASMLESS_SETUP_NO_APT=1 . scripts/setup.sh  # the Debian packages are for the tests
# WASMLESS_CLI: a `wasmless` built already, run instead of building one. The end-to-end
# run passes the test build's: a `cargo build -p wasmless` of its own would compile the
# CLI (and what it shares with the runtime) a second time, with other features, over it.
if [[ -z ${WASMLESS_CLI:-} ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
  cargo build --release --quiet -p wasmless
  WASMLESS_CLI=$CARGO_TARGET_DIR/release/wasmless
fi
exec "$WASMLESS_CLI" dev "${@:-examples/hello-go}"
