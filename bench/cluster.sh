#!/usr/bin/env bash
# Start-up figures on the test cluster (scripts/cluster.sh): `kubectl apply` of a new Goless
# sample to its first 200 with the node's build cache emptied and then warm, an edit and a
# revert to their new answer (each with the builder's phases), and a new pod of a built
# Function against Goless's own way (an init container running `go build`), phase by phase. Writes its section of
# docs/benchmarks.md (between the bench/cluster.sh markers; bench/run.sh keeps it).
# `density` instead: a thousand Functions with `scale.min: 0` served by one pool pod, without
# and with the node's code store (deploy/node-agent/; bench/src/pool_pod/), its section
# "Pool density on the cluster".
# `defaults`: Go Functions at the operator's own settings, with the node agent installed
# (bench/src/pool_pod/defaults.rs), its section "A hundred Go Functions at the operator's
# defaults".
#   bench/cluster.sh [REPS]     (default 3; takes the cluster down again if it started it)
#   bench/cluster.sh density [--pool-functions N --pool-go-functions M --output FILE]
#                               (default 1000 Functions, 100 of them Go, into docs/benchmarks.md)
#   bench/cluster.sh defaults [--pool-go-functions M --output FILE]   (default 100)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
cargo test --release --workspace --no-run --quiet   # the binaries scripts/test.sh builds
images=$(scripts/build-images.sh)
if [[ $(scripts/cluster.sh status) != *'kube-apiserver: running'* ]]; then
  trap 'scripts/cluster.sh down' EXIT
fi
scripts/cluster.sh up >/dev/null
eval "$(scripts/cluster.sh env)"
# shellcheck disable=SC2086 # one archive per line
scripts/cluster.sh load $images
kubectl apply -k deploy/ >/dev/null
kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null

if [[ ${1:-} == density || ${1:-} == defaults ]]; then
  scripts/cluster.sh node-agent   # the node's code store
  cargo build --release --quiet -p wasmless-bench   # `cargo test --no-run` builds no binary to run
  only=pool-pod
  [[ $1 == defaults ]] && only=pool-defaults
  "$CARGO_TARGET_DIR/release/wasmless-bench" --bin-dir "$CARGO_TARGET_DIR/release" --only "$only" "${@:2}"
else
  python3 bench/cluster.py "${1:-3}"
fi
