# The `wasmless` command against the cluster: deploy, get, logs.
# Sourced by e2e/run.sh, which runs the steps in its order; e2e/lib.sh has the helpers.

cli_deploy() {
  step "wasmless deploy, get and logs: a URL that answers This works!, the compiler's message for a broken handler"
  local wasmless=${CARGO_TARGET_DIR:-$HOME/.cache/wasmless/target}/release/wasmless ns=e2e-cli out url
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  out=$("$wasmless" deploy examples/hello-go -n "$ns" --timeout 10m)
  echo "$out"
  url=$(awk '/^From a node: / { print $4 }' <<<"$out")
  [[ -n $url ]] || fail "wasmless deploy printed no address: $out"
  # deploy returned once the rollout to the built template is over: the request below
  # reaches the pod whose log `wasmless logs` reads.
  # deploy waits for the Service's endpoints; kube-proxy programs a new Service a moment later.
  wait_until 10 "the address wasmless deploy printed to answer" get "$url"
  expect_eq "$(get "$url")" "This works!" "GET of the URL wasmless deploy printed"
  # A bare handler with a syntax error: a Function named after its directory, Failed.
  mkdir -p "$WORK/broken-greeter"
  printf 'package handlers

import "net/http"

func Handler(w http.ResponseWriter, r *http.Request) {
	w.Write([]byte("hi")
}
' \
    >"$WORK/broken-greeter/handler.go"
  local status=0
  out=$("$wasmless" deploy "$WORK/broken-greeter" -n "$ns" --timeout 10m 2>&1) || status=$?
  echo "$out" | tail -3
  [[ $status -ne 0 ]] || fail "wasmless deploy of a broken handler exited 0"
  expect_contains "$out" "Function broken-greeter failed (BuildFailed)" "wasmless deploy's error"
  expect_contains "$out" "syntax error" "the compiler's message"
  [[ $out != *backtrace* ]] || fail "wasmless deploy printed a backtrace: $out"
  out=$("$wasmless" get -n "$ns")
  echo "$out"
  expect_eq "$(awk '$1 == "hello" { print $2, $3, $4 }' <<<"$out")" "go Ready 1" "wasmless get's hello row"
  expect_eq "$(awk '$1 == "broken-greeter" { print $3 }' <<<"$out")" "Failed" "wasmless get's broken-greeter row"
  out=$("$wasmless" logs hello -n "$ns" --tail 5)
  expect_contains "$out" '"message":"request"' "wasmless logs hello"
  expect_contains "$out" "[hello-" "wasmless logs' pod prefix"
  kubectl delete namespace "$ns" --wait=false >/dev/null
  ok
}
