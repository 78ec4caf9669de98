#!/usr/bin/env bash
# The test command: sets up what is missing, checks formatting, fuzzes every parser of
# untrusted bytes for a bounded time (scripts/fuzz.sh), builds the release binaries once
# with clippy's lints, makes the images from them, starts the test cluster
# (scripts/cluster.sh), runs every test against the release build and the cluster, then the
# end-to-end run (e2e/run.sh), and takes the cluster down again, whatever happened. Each
# step's start is marked `== STEP (SECONDS s)`, and the marks are summed up at the end
# (docs/testing.md has a cold and a warm run's).
set -euo pipefail
cd "$(dirname "$0")/.."

marks=()
step() {
  printf '\n== %s (%ss)\n' "$*" "$SECONDS"
  marks+=("$SECONDS $*")
}
# kill_tree PID: PID and every process under it, children first.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# The minutes each step took, whatever ended the run.
summary() {
  # A run that stopped early leaves no Go build or fuzzer behind.
  [[ -n ${go_build:-} ]] && kill_tree "$go_build"
  [[ -n ${helm_build:-} ]] && kill_tree "$helm_build"
  [[ -n ${fuzz_run:-} ]] && { kill_tree "$fuzz_run"; echo "the fuzzing's log so far: $fuzz_log"; tail -n 5 "$fuzz_log"; }
  marks+=("$SECONDS in all")
  printf '\n== step marks (minutes)\n'
  printf '%s\n' "${marks[@]}" | awk '
    NR > 1 { printf "%6.1f  %s\n", ($1 - start) / 60, name }
    { start = $1; $1 = ""; name = substr($0, 2) }
    END { printf "%6.1f  in all\n", start / 60 }'
}
trap summary EXIT

step "set-up (scripts/setup.sh)"
. scripts/setup.sh
# One target directory outside the checkout, so a fresh clone on the same machine
# reuses the compiled dependencies (wasmtime is minutes of compiling on 2 cores).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# Go compiles in the background while Rust compiles in the foreground: a Rust build leaves a
# core idle for minutes at a time (one large crate, or a link, holding up the rest), and Go
# fills it. Prometheus (scripts/lib.sh), then Kubernetes, etcd, CoreDNS, the pause image and
# metrics-server (scripts/cluster.sh build), then the OpenTelemetry Collector of the
# runtime's trace test and the NATS server of the events tests; the cluster and the tests
# wait for them.
step "Go: Prometheus, Kubernetes, etcd, CoreDNS, metrics-server, OpenTelemetry Collector, NATS, started in the background"
go_log=$(mktemp /tmp/wasmless-go-build.XXXXXX)
# shellcheck source=scripts/lib.sh
(. scripts/lib.sh && prometheus_tool && scripts/cluster.sh build && otelcol_tool && nats_server_tool) >"$go_log" 2>&1 &
go_build=$!
# Helm is needed only at the end (the e2e's last step, then the Helm check): built at nice
# 19, in this session (see the fuzzing below), it takes only CPU the rest leaves idle, where
# beside Kubernetes it slowed the release build. Its own lock makes a caller wait for it.
# The shared module is resolved first, at full priority: the Go job above waits on its lock.
helm_log=$(mktemp /tmp/wasmless-helm-build.XXXXXX)
(. scripts/lib.sh && go_tools_module >/dev/null && exec nice -n 19 bash -c '. scripts/lib.sh && helm_tool') >"$helm_log" 2>&1 &
helm_build=$!

step "cargo fmt --check"
cargo fmt --all -- --check

step "no hall grew: import circles, files over 600 lines, functions over 100 (scripts/rooms.py)"
python3 scripts/rooms.py

step "gofmt and go vet (sdk/go)"
unformatted=$("$(go env GOROOT)/bin/gofmt" -l sdk/go runtime/tests/handlers scripts/cluster scripts/otelcol builder/tests/modules builder/tests/native_go scripts/go-cache-seed-handler.go)
[[ -z $unformatted ]] || { echo "gofmt would change: $unformatted"; exit 1; }
(cd sdk/go && GOOS=wasip1 GOARCH=wasm GOFLAGS=-mod=mod GOPROXY=off go vet ./...)

step "shell and Python scripts parse, the dashboard is JSON, every link between the docs leads somewhere"
for script in scripts/*.sh e2e/*.sh e2e/steps/*.sh bench/*.sh; do bash -n "$script"; done
# The dashboard check and picture (standard library; matplotlib imported only when drawing).
python3 -c 'import ast, sys; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]' e2e/dashboard_queries.py e2e/dashboard_picture.py e2e/trace_picture.py e2e/page.py e2e/in_brief.py
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' deploy/grafana/wasmless.json
python3 scripts/check-links.py

# Every parser of untrusted bytes under libFuzzer for a bounded time (docs/fuzzing.md), in
# the background at the lowest priority: at nice 19 it takes only the CPU the builds and
# the tests leave idle (cold, its build ended inside `cargo test` and the fuzzing inside
# the e2e; docs/testing.md). Its result is waited for after the e2e.
# WASMLESS_FUZZ_SECONDS=0 skips it.
if [[ ${WASMLESS_FUZZ_SECONDS:-30} -gt 0 ]]; then
  # Fetched first at full priority: a starved cargo holding the package cache's lock
  # would hold up the release build's.
  (cd fuzz && cargo fetch --quiet)
  fuzz_log=$(mktemp /tmp/wasmless-fuzz.XXXXXX)
  step "fuzz every parser of untrusted bytes (scripts/fuzz.sh ${WASMLESS_FUZZ_SECONDS:-30}), started in the background at nice 19 (its log: $fuzz_log)"
  # In this session, not one of its own: with autogroup scheduling (Linux's default), a
  # nice value only ranks a process against those of its own session.
  nice -n 19 scripts/fuzz.sh "${WASMLESS_FUZZ_SECONDS:-30}" >"$fuzz_log" 2>&1 &
  fuzz_run=$!
fi

# `cargo test` builds the binaries too, with the dev-dependencies' features unified; a plain
# `cargo build` would compile a second set. The images take these binaries.
#
# Clippy lints the workspace's crates in the same build: clippy-driver is rustc with the
# lints added, and is what `cargo clippy` itself runs as the workspace wrapper. Run apart,
# `cargo clippy` first builds the metadata of every dependency a second time (5 of the 82
# minutes of a cold run). Both cargo calls take the same wrapper and CLIPPY_ARGS, which are
# part of the crates' fingerprints; the wrapper goes by --config, not the environment, so
# the `cargo build`s the builder runs for Rust handlers under test do not inherit it.
# (clippy-driver compiles without MIR optimizations, LLVM's still run: these binaries are
# for tests, and the benchmarks build their own.)
lint=(--config "build.rustc-workspace-wrapper=\"$(rustc --print sysroot)/bin/clippy-driver\"")
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__ # cargo clippy's encoding of `-- -D warnings`
step "cargo test --no-run, linted by clippy (one release build: the images, the tests and the cluster share it)"
cargo "${lint[@]}" test --release --workspace --all-targets --no-run --quiet

step "waiting for the Go builds (their log: $go_log)"
wait "$go_build" || { tail -n 60 "$go_log"; echo "the Go builds failed: the whole log is $go_log"; exit 1; }
# The runtime's trace test runs this collector (built above, so this only prints its path).
export WASMLESS_OTELCOL
WASMLESS_OTELCOL=$(. scripts/lib.sh && otelcol_tool)
# The events tests' broker, likewise.
export WASMLESS_NATS_SERVER
WASMLESS_NATS_SERVER=$(. scripts/lib.sh && nats_server_tool)

step "images (scripts/build-images.sh)"
images=$(scripts/build-images.sh)

step "test cluster up (scripts/cluster.sh)"
# From no cluster: one left up by a run stopped before its trap (`up` would reuse it) may
# still hold the e2e's installed operator, which then reconciles the scenarios' Functions
# beside the tests with its own builder image (stop 54's CI: 16 scenarios left Building).
scripts/cluster.sh down
trap 'step "test cluster down"; scripts/cluster.sh down; summary' EXIT
export WASMLESS_TEST_KUBECONFIG
WASMLESS_TEST_KUBECONFIG=$(scripts/cluster.sh up)
eval "$(scripts/cluster.sh env)"
# shellcheck disable=SC2086 # one archive per line
scripts/cluster.sh load $images

# The test binaries side by side (scripts/test-lanes.py), as cargo runs them one by one.
# The Function CRD first, as the operator's scenarios apply it: the runtime's pool tests
# give their entries an owner of that kind, which the garbage collector would delete as
# missing were the CRD to appear in the middle of them.
kubectl apply --server-side --field-manager wasmless-tests --force-conflicts -f crds/function.yaml >/dev/null
step "cargo test (release, two binaries at a time: scripts/test-lanes.py; the real_api scenarios of the operator and the runtime's pool on the test cluster)"
# No backtraces: a failed test's own lines (a real_api scenario's namespace among them) come
# first in what a CI run shows, not sixty frames of tokio; a panic still names its line.
cargo "${lint[@]}" test --release --workspace --no-run --quiet --message-format=json |
  RUST_BACKTRACE=0 python3 scripts/test-lanes.py --doc cargo "${lint[@]}" test --release --workspace --doc

step "end to end on the test cluster (e2e/run.sh)"
e2e/run.sh

step "the Helm chart installs what deploy/ does (scripts/check-helm.sh)"
wait "$helm_build" || { cat "$helm_log"; echo "building Helm failed (above)"; exit 1; }
helm_build=""
scripts/check-helm.sh

if [[ -n ${fuzz_run:-} ]]; then
  step "waiting for the fuzzing (started in the background)"
  fuzz_status=0
  wait "$fuzz_run" || fuzz_status=$?
  fuzz_run=""
  cat "$fuzz_log"
  ((fuzz_status == 0)) || { echo "the fuzzing failed (above; scripts/fuzz.sh says how to run a target again)"; exit 1; }
fi
