#!/usr/bin/env bash
# The test command: sets up what is missing, then checks formatting and lints, builds
# the release binaries once, and runs every test against them.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/setup.sh
# One target directory outside the checkout, so a fresh clone on the same machine
# reuses the compiled dependencies (wasmtime is minutes of compiling on 2 cores).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "gofmt and go vet (sdk/go)"
unformatted=$("$(go env GOROOT)/bin/gofmt" -l sdk/go runtime/tests/handlers)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted"; exit 1; }
(cd sdk/go && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod GOPROXY=off go vet ./...)

step "cargo clippy"
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

step "cargo test (release: the tests drive the release binary)"
cargo test --release --workspace
