# Go modules: a handler importing github.com/google/uuid, with its go.mod and go.sum, built
# through a module proxy the run serves itself (the directory scripts/goproxy.sh filled from
# the real proxy at set-up, as static files on the pod bridge's gateway) — and, with no proxy
# set on the operator, Failed with a message that says what to set.
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
