# Go modules: a handler importing github.com/google/uuid, with its go.mod and go.sum, built
# through a module proxy the run serves itself (the directory scripts/goproxy.sh filled from
# the real proxy at set-up, as static files on the pod bridge's gateway) — and, with no proxy
# set on the operator, Failed with a message that says what to set. And build_time_code: a
# procedural macro from the tests' own crates registry, run by a build Job, writes only into
# its own namespace's build cache.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

go_modules() {
  step "Go modules: no proxy set, a handler importing github.com/google/uuid is Failed naming the setting; with --go-proxy, it builds through the proxy (go.sum checked) and serves"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless ns=e2e-modules
  local proxy=$GATEWAY:3000 served out status=0 url
  served=$(scripts/goproxy.sh)
  python3 -m http.server --bind "$GATEWAY" 3000 --directory "$served" >"$WORK/goproxy.log" 2>&1 &
  PIDS+=($!)
  wait_until 30 "the module proxy" curl -fsS "http://$proxy/github.com/google/uuid/@v/list"
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

  # The operator as installed has no proxy: the build fails as the source's, at once.
  out=$("$wasmless" deploy builder/tests/modules/uuid --name uuid-no-proxy -n "$ns" --timeout 10m 2>&1) || status=$?
  echo "$out" | tail -3
  [[ $status -ne 0 ]] || fail "wasmless deploy of a handler needing modules, with no proxy, exited 0"
  expect_eq "$(kubectl get fn uuid-no-proxy -n "$ns" -o 'jsonpath={.status.phase}')" Failed "uuid-no-proxy's phase"
  local message
  message=$(kubectl get fn uuid-no-proxy -n "$ns" -o 'jsonpath={.status.buildMessage}')
  expect_contains "$message" "go.mod requires github.com/google/uuid v1.6.0" "uuid-no-proxy's buildMessage"
  expect_contains "$message" "--go-proxy" "the operator's flag in the buildMessage"
  expect_contains "$message" "builder.goProxy" "the Helm value in the buildMessage"

  # The operator told of the proxy: build Jobs get WASMLESS_GOPROXY.
  kubectl set env deploy/wasmless-operator -n wasmless-system "WASMLESS_GOPROXY=http://$proxy" >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  out=$("$wasmless" deploy builder/tests/modules/uuid --name uuid -n "$ns" --timeout 10m 2>&1) ||
    fail "wasmless deploy of uuid through the proxy: $out"
  echo "$out"
  url=$(awk '/^From a node: / { print $4 }' <<<"$out")
  [[ -n $url ]] || fail "wasmless deploy printed no address: $out"
  wait_until 10 "uuid's address to answer" get "$url"
  out=$(get "${url}orders")
  echo "$out" | sed 's/^/    /'
  expect_contains "$out" "version 4" "a random UUID from github.com/google/uuid"
  expect_contains "$out" "named 90f6f92d-9225-5d4a-95e7-4b9f27291d32" "uuid.NewSHA1(NameSpaceURL, /orders), as native Go gives it"
  expect_contains "$(cat "$WORK/goproxy.log")" "GET /github.com/google/uuid/@v/v1.6.0.zip" "the build Job's download from the proxy"

  # Back to the operator as installed, for the steps after this one.
  kubectl set env deploy/wasmless-operator -n wasmless-system WASMLESS_GOPROXY- >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  kubectl delete namespace "$ns" --wait=false >/dev/null
  ok
}

# Door 2 of docs/security.md, tried with code that runs at build time: a procedural macro
# (e2e/crates/cache-probe, published in the tests' own crates registry by
# scripts/cargo-registry.sh) writes a marker into every directory a build lets it, and
# reports what it saw. Another namespace's cache was there first; it must not be seen or
# written, and that namespace's next build must serve what its own source says.
build_time_code() {
  step "door 2: a procedural macro from a crates registry writes wherever a build Job lets it: only its own namespace's cache, and another namespace's next build is unaffected"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless ns=e2e-build-time
  local crates=$GATEWAY:3001 registry out url report planted outside
  local cache=/var/lib/wasmless/builds/namespaces
  registry=$(scripts/cargo-registry.sh)
  scripts/cargo-registry.sh config "http://$crates"
  python3 -m http.server --bind "$GATEWAY" 3001 --directory "$registry" >"$WORK/crates.log" 2>&1 &
  PIDS+=($!)
  wait_until 30 "the crates registry" curl -fsS "http://$crates/index/ca/ch/cache-probe"
  [[ -d $cache/$NS/build ]] || fail "$NS has no build cache on the node to be attacked: $(ls "$cache")"
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl set env deploy/wasmless-operator -n wasmless-system "WASMLESS_CARGO_REGISTRY=sparse+http://$crates/index/" >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null

  mkdir -p "$WORK/prober/src"
  printf '[package]\nname = "prober"\nversion = "0.1.0"\nedition = "2024"\n\n[dependencies]\ncache-probe = "0.1"\n' >"$WORK/prober/Cargo.toml"
  cat >"$WORK/prober/src/lib.rs" <<'RUST'
use wasmless_sdk::{Request, Response};

const REPORT: &str = cache_probe::probe!();

pub fn handler(_request: Request) -> Response {
    Response::new(REPORT.as_bytes().to_vec())
}
RUST
  out=$("$wasmless" deploy "$WORK/prober" --name prober -n "$ns" --timeout 10m 2>&1) || fail "wasmless deploy of prober: $out"
  url=$(awk '/^From a node: / { print $4 }' <<<"$out")
  [[ -n $url ]] || fail "wasmless deploy printed no address: $out"
  wait_until 10 "prober's address to answer" get "$url"
  report=$(get "$url")
  grep -E '^(wrote|planted)' <<<"$report" | sed 's/^/    macro: /'
  expect_contains "$(cat "$WORK/crates.log")" "GET /crates/cache-probe/cache-probe-0.1.0.crate" "the build Job's download of the macro"
  expect_contains "$report" "planted" "the macro's report of the cache it found"
  [[ $report != *"$NS"* ]] || fail "the macro saw $NS, another namespace: $(grep -F "$NS" <<<"$report" | head -3)"

  planted=$(find /var/lib/wasmless/builds -name planted-by-cache-probe)
  [[ -n $planted ]] || fail "the macro planted nothing in the node's build cache: it did not run where a build's cache is"
  echo "    $(wc -l <<<"$planted") markers on the node, every one under $cache/$ns/build/"
  outside=$(grep -v "^$cache/$ns/build/" <<<"$planted" || true)
  [[ -z $outside ]] || fail "the macro wrote outside its namespace's build cache: $(head -3 <<<"$outside")"

  # The other namespace builds next, a Rust handler through the same rust-target a shared
  # cache would have given the macro: it serves what its own source says.
  local manifest
  manifest=$(python3 -c 'import json,sys; print(json.dumps({
    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
    "metadata": {"name": "after-the-macro", "namespace": sys.argv[1]},
    "spec": {"language": "rust", "scale": {"min": 1, "max": 1}, "source": "use wasmless_sdk::{Request, Response};\n\npub fn handler(_request: Request) -> Response {\n    Response::new(b\"built from its own source\".to_vec())\n}\n"}}))' "$NS")
  kubectl apply -f - <<<"$manifest" >/dev/null
  settled() { [[ $(fn_field after-the-macro .status.phase) =~ ^(Ready|Failed)$ ]]; }
  wait_until 600 "after-the-macro Ready or Failed" settled
  phase_is after-the-macro Ready || fail "after-the-macro: $(fn_field after-the-macro .status.buildMessage)"
  expect_service_answer after-the-macro "built from its own source"

  kubectl delete fn after-the-macro -n "$NS" --wait=false >/dev/null
  kubectl set env deploy/wasmless-operator -n wasmless-system WASMLESS_CARGO_REGISTRY- >/dev/null
  kubectl rollout status deploy/wasmless-operator -n wasmless-system --timeout=180s >/dev/null
  kubectl delete namespace "$ns" --wait=false >/dev/null
  ok
}
