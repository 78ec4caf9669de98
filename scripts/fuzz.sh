#!/usr/bin/env bash
# Fuzzes every parser of untrusted bytes (fuzz/, docs/fuzzing.md): builds the cargo fuzz
# targets, then runs each for SECONDS (default 30) and fails on the first crash.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      # all targets when none is named
#   WASMLESS_FUZZ_JOBS=1 WASMLESS_FUZZ_NICE=10 scripts/fuzz.sh 3600 code
#
# The seed corpus in fuzz/corpus/<target> is only read: what libFuzzer learns goes to
# ~/.cache/wasmless/fuzz-corpus/<target> (WASMLESS_FUZZ_CORPUS), kept between runs so a
# longer run starts where the last one stopped, and a crashing input to
# ~/.cache/wasmless/fuzz-crashes/<target>/. Nothing is written into the checkout.
#
# cargo fuzz needs nightly flags (-Zsanitizer); RUSTC_BOOTSTRAP=1 lets the stable
# toolchain take them, so no nightly toolchain is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
shift || true
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2; exit 2; }

SAY_AS=fuzz
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

CARGO_FUZZ_VERSION=0.13.2
tools="$HOME/.cache/wasmless/tools/cargo-fuzz"
if [[ ! -x $tools/bin/cargo-fuzz ]] || ! "$tools/bin/cargo-fuzz" --version | grep -qF "$CARGO_FUZZ_VERSION"; then
  say "installing cargo-fuzz $CARGO_FUZZ_VERSION from crates.io into $tools"
  cargo install --quiet --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" --root "$tools" >&2
fi
export PATH="$tools/bin:$PATH"
export RUSTC_BOOTSTRAP=1
# Its own target directory: the instrumented build shares nothing with the normal one.
target_dir="${WASMLESS_FUZZ_TARGET_DIR:-$HOME/.cache/wasmless/fuzz-target}"
corpora="${WASMLESS_FUZZ_CORPUS:-$HOME/.cache/wasmless/fuzz-corpus}"
crashes="$HOME/.cache/wasmless/fuzz-crashes"

mapfile -t all < <(cd fuzz && cargo fuzz list)
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all[@]}")
for target in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $target "* ]] || { say "no fuzz target $target (there are: ${all[*]})"; exit 2; }
done

start=$SECONDS
say "building the fuzz targets (release, debug assertions, AddressSanitizer) in $target_dir"
build_log=$(mktemp)
# All targets at once: they share every dependency. The instrumented wasmtime is the bulk
# of a cold build; fuzz/Cargo.toml compiles what no target runs at opt-level 0.
if ! (cd fuzz && cargo fuzz build --release --debug-assertions --target-dir "$target_dir") >"$build_log" 2>&1; then
  grep -v '^ *Compiling ' "$build_log" | tail -n 80 >&2
  rm -f "$build_log"
  say "the fuzz targets do not build (see above)"
  exit 1
fi
rm -f "$build_log"
bin="$target_dir/x86_64-unknown-linux-gnu/release"
say "built in $((SECONDS - start)) s"
git diff --quiet -- fuzz/Cargo.lock 2>/dev/null ||
  say "warning: fuzz/Cargo.lock changed (a dependency of the main workspace moved): commit it"

# One target: its log and exit status land in $runs/<target>.{log,rc}.
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
fuzz_one() {
  local target=$1 rc=0
  mkdir -p "$corpora/$target" "$crashes/$target"
  # The first corpus directory receives new inputs; the seed directory is only read.
  # -timeout: a unit over 30 s is a hang; -rss_limit_mb: the parsers cap what they
  # allocate (256 MiB modules, 1 GiB code), so 4 GiB is over any legitimate input.
  nice -n "${WASMLESS_FUZZ_NICE:-0}" "$bin/$target" "$corpora/$target" "fuzz/corpus/$target" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$crashes/$target/" >"$runs/$target.log" 2>&1 || rc=$?
  echo "$rc" >"$runs/$target.rc"
}

# WASMLESS_FUZZ_JOBS targets at a time (default 2, one a core): a fuzzer is one process.
jobs=${WASMLESS_FUZZ_JOBS:-2}
say "fuzzing ${#targets[@]} targets ${seconds}s each, $jobs at a time"
for target in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
  fuzz_one "$target" &
done
wait

failed=()
for target in "${targets[@]}"; do
  if [[ $(cat "$runs/$target.rc") == 0 ]]; then
    printf '[fuzz] %s: %s\n' "$target" \
      "$(grep -E '^(Done|stat::new_units_added)' "$runs/$target.log" | tr -s ' \n' ' ')" >&2
  else
    # The panic or sanitizer report and libFuzzer's summary, not its 40-frame stacks.
    grep -E -A4 'panicked at|ERROR: (AddressSanitizer|libFuzzer)|^SUMMARY|Test unit written' "$runs/$target.log" |
      head -n 40 >&2
    say "$target CRASHED: the input is in $crashes/$target/ (reproduce: $bin/$target <file>)"
    failed+=("$target")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  say "crashes in: ${failed[*]}"
  exit 1
fi
say "${#targets[@]} targets fuzzed ${seconds}s each, no crash ($((SECONDS - start)) s in all)"
