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
#                               (default 1100 Functions, 1000 of them Go, into docs/benchmarks.md;
#                               their builds in an OCI registry it starts on the node)
#   bench/cluster.sh defaults [--pool-go-functions M --output FILE]   (default 100)
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"
cargo test --release --workspace --no-run --quiet   # the binaries scripts/test.sh builds
images=$(scripts/build-images.sh)
# What to undo on the way out, last first.
cleanup=()
trap 'for ((i = ${#cleanup[@]} - 1; i >= 0; i--)); do eval "${cleanup[i]}" || true; done' EXIT
if [[ $(scripts/cluster.sh status) != *'kube-apiserver: running'* ]]; then
  cleanup+=('scripts/cluster.sh down')
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
  only=pool-pod registry_args=()
  if [[ $1 == density ]]; then
    # The builds go to an OCI registry on the pod bridge's gateway (Debian's docker-registry,
    # as e2e's storage: oci step runs it): a thousand Go Functions' code is more than etcd
    # holds. Its files are the run's, deleted after.
    registry=$WASMLESS_CLUSTER_GATEWAY:5000 registry_dir=$(mktemp -d /var/tmp/wasmless-bench-registry.XXXXXX)
    printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "%s"}\n' \
      "$registry_dir/data" "$registry" >"$registry_dir/config.yml"
    docker-registry serve "$registry_dir/config.yml" >"$registry_dir/registry.log" 2>&1 &
    registry_pid=$!
    cleanup+=('kill $registry_pid && { wait $registry_pid 2>/dev/null || true; }; rm -rf "$registry_dir"')
    for _ in $(seq 50); do curl -fsS "http://$registry/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
    curl -fsS "http://$registry/v2/" >/dev/null || { cat "$registry_dir/registry.log" >&2; exit 1; }
    export WASMLESS_OCI_PLAIN_HTTP=$registry
    registry_args=(--pool-registry "$registry")
    # Go at the scale of Rust: a thousand Go Functions, and a hundred Rust ones beside.
    [[ " ${*:2} " == *' --pool-functions '* ]] || registry_args+=(--pool-functions 1100)
    [[ " ${*:2} " == *' --pool-go-functions '* ]] || registry_args+=(--pool-go-functions 1000)
  fi
  [[ $1 == defaults ]] && only=pool-defaults
  "$CARGO_TARGET_DIR/release/wasmless-bench" --bin-dir "$CARGO_TARGET_DIR/release" --only "$only" "${registry_args[@]}" "${@:2}"
else
  python3 bench/cluster.py "${1:-3}"
fi
