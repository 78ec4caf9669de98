#!/usr/bin/env bash
# The test command: sets up what is missing, checks formatting and lints, fuzzes every
# parser of untrusted bytes for a bounded time (scripts/fuzz.sh), builds the release
# binaries once, makes the images from them, starts the test cluster (scripts/cluster.sh),
# runs every test against the release build and the cluster, then the end-to-end run
# (e2e/run.sh), and takes the cluster down again, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/setup.sh
# One target directory outside the checkout, so a fresh clone on the same machine
# reuses the compiled dependencies (wasmtime is minutes of compiling on 2 cores).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "gofmt and go vet (sdk/go)"
unformatted=$("$(go env GOROOT)/bin/gofmt" -l sdk/go runtime/tests/handlers)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted"; exit 1; }
(cd sdk/go && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod GOPROXY=off go vet ./...)

step "shell and Python scripts parse, the dashboard is JSON"
for script in scripts/*.sh e2e/*.sh bench/*.sh; do bash -n "$script"; done
# The dashboard check and picture (standard library; matplotlib imported only when drawing).
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' e2e/dashboard_queries.py e2e/dashboard_picture.py
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' deploy/grafana/wasmless.json

step "the Helm chart installs what deploy/ does (scripts/check-helm.sh)"
scripts/check-helm.sh

step "cargo clippy"
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

# Every parser of untrusted bytes under libFuzzer for a bounded time (docs/fuzzing.md):
# cold, the instrumented build is most of it; WASMLESS_FUZZ_SECONDS=0 skips it.
if [[ ${WASMLESS_FUZZ_SECONDS:-30} -gt 0 ]]; then
  step "fuzz every parser of untrusted bytes (scripts/fuzz.sh ${WASMLESS_FUZZ_SECONDS:-30})"
  scripts/fuzz.sh "${WASMLESS_FUZZ_SECONDS:-30}"
fi

# `cargo test` builds the binaries too, with the dev-dependencies' features unified; a plain
# `cargo build` would compile a second set. The images take these binaries.
step "cargo test --no-run (one release build: the images, the tests and the cluster share it)"
cargo test --release --workspace --no-run --quiet

step "images (scripts/build-images.sh)"
images=$(scripts/build-images.sh)

step "test cluster up (scripts/cluster.sh)"
trap 'step "test cluster down"; scripts/cluster.sh down' EXIT
export WASMLESS_TEST_KUBECONFIG
WASMLESS_TEST_KUBECONFIG=$(scripts/cluster.sh up)
eval "$(scripts/cluster.sh env)"
# shellcheck disable=SC2086 # one archive per line
scripts/cluster.sh load $images

step "cargo test (release; the operator's real_api scenarios on the test cluster)"
cargo test --release --workspace

step "end to end on the test cluster (e2e/run.sh)"
e2e/run.sh
