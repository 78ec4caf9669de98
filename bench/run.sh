#!/usr/bin/env bash
# The benchmark suite's one entry point: installs what it needs (Debian's wrk,
# wasmtime-cli 48 built once into ~/.cache/wasmless/tools), builds everything in
# release mode, runs every comparison, and writes docs/benchmarks.md and its plot.
#   bench/run.sh           full run (criterion bench included), under 15 minutes once tools are built
#   bench/run.sh --quick   shorter runs, under 3 minutes
#   bench/run.sh [--quick] --only outbound|pool|streaming|traces   one comparison; rewrites only its section
set -euo pipefail
cd "$(dirname "$0")/.."

WASMLESS_SETUP_NO_APT=1 . scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}"

if ! command -v wrk >/dev/null 2>&1; then
  sudo=(); [[ $(id -u) -ne 0 ]] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq wrk
fi

tools="$HOME/.cache/wasmless/tools"
wasmtime="$tools/bin/wasmtime"
# `--only outbound` compares with native Go alone: no wasmtime-cli needed.
if [[ " $* " != *" --only "* ]] && { [[ ! -x $wasmtime ]] || ! "$wasmtime" --version | grep -q '^wasmtime 48\.'; }; then
  echo "building wasmtime-cli 48 once (cached in $tools; this takes a while)" >&2
  cargo install --quiet --locked --root "$tools" wasmtime-cli --version '^48' >&2
fi

# --all-targets: the features of `cargo test`, so the test command's release build is reused (`-p` would
# compile wasmtime again with other features).
cargo build --release --quiet --workspace --all-targets
if [[ " $* " != *" --quick "* && " $* " != *" --only "* ]]; then
  cargo bench --quiet --workspace --bench instantiate >&2
fi
exec "$CARGO_TARGET_DIR/release/wasmless-bench" --root . --bin-dir "$CARGO_TARGET_DIR/release" \
  --wasmtime "$wasmtime" --output docs/benchmarks.md "$@"
